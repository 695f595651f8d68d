import numpy as np
import pytest

from edge.export.quant import QuantizationError
from edge.export.quant.calibration_text import corpus, split_topics, token_sequences


def test_splits_never_overlap():
    cal, cal_meta = corpus("calibration")
    ev, ev_meta = corpus("evaluation")
    assert len(cal) > 200_000 and len(ev) > 100_000
    assert not set(split_topics()["calibration"]) & set(split_topics()["evaluation"])
    assert not set(cal.split("\n\n")) & set(ev.split("\n\n"))
    assert cal_meta["sha256"] != ev_meta["sha256"] and "pydoc_data" in cal_meta["source"]
    assert corpus("calibration") == (cal, cal_meta)  # deterministic


def test_token_sequences_are_disjoint_windows():
    def encode(text):  # a byte-level stand-in for a tokenizer
        return list(text.encode("utf-8"))

    seqs, meta = token_sequences(encode, "calibration", num_sequences=16, seq_len=256)
    assert seqs.shape == (16, 256) and seqs.dtype == np.int64
    text = corpus("calibration")[0].encode("utf-8")
    starts = meta["window_starts"]
    assert all(text[a : a + 256] == bytes(s.tolist()) for a, s in zip(starts, seqs))
    assert all(b - a >= 256 for a, b in zip(starts, starts[1:])) and starts[-1] + 256 <= len(text)
    assert meta["num_sequences"] == 16 and meta["tokens"] == len(text)
    with pytest.raises(QuantizationError, match="fewer"):
        token_sequences(encode, "evaluation", num_sequences=10_000, seq_len=512)
    with pytest.raises(QuantizationError, match="split"):
        corpus("train")
