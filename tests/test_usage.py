import subprocess
import sys

import numpy as np

from edge.memory.usage import peak_rss_bytes, rss_bytes


def test_peak_is_at_least_current_and_sees_a_large_allocation():
    before = peak_rss_bytes()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    assert peak_rss_bytes() >= max(before, rss_bytes()) and peak_rss_bytes() >= block.nbytes


def test_child_of_a_large_parent_reports_its_own_peak():
    """A benchmark driver holding a big model must not inflate its workers' numbers (ru_maxrss would)."""
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB in the parent
    code = "from edge.memory.usage import peak_rss_bytes; print(peak_rss_bytes())"
    child_peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child_peak < 200 * 2**20 < ballast.nbytes


def test_terms_are_measured_in_fresh_processes(tmp_path):
    """The runtime's RSS at the memory model's terms: session, buffers (a tiny model's caches are small, so about
    the session), growing steps; and a paged package's peak."""
    import pytest

    pytest.importorskip("transformers")
    from edge.export.paged import export_paged
    from edge.export.pipeline import export_model
    from edge.memory.usage import measure_paged, measure_resident
    from tiny_models import tiny_llama

    _, imported = tiny_llama(num_hidden_layers=2)
    resident = export_model("tiny", tmp_path / "r", quant="fp32", model=imported)
    measured = measure_resident(resident, 64, [1, 8, 32])
    assert 40 * 2**20 < measured["session"] <= measured["buffers"] < measured["session"] + 8 * 2**20
    assert len(measured["steps"]) == 3 and all(0 <= s < 16 * 2**20 for s in measured["steps"])
    peak = measure_paged(export_paged(imported, tmp_path / "p"), pinned=0, window=2)
    assert 40 * 2**20 < peak < 400 * 2**20
    with pytest.raises(RuntimeError, match="failed"):
        measure_paged(tmp_path / "missing", pinned=0, window=2)


def test_a_loaded_tokenizer_hands_the_parse_garbage_back():
    """tokenizers parses a tokenizer.json into many small allocations and frees them once the tokenizer is built;
    glibc keeps those pages unless asked (release_free_heap). In a fresh process: a synthetic 200,000-entry BPE keeps
    far less resident through edge.tokenizer.Tokenizer than through tokenizers.Tokenizer.from_file alone."""
    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    code = """
import json, os, sys, tempfile
import tokenizers
from edge.memory.usage import anon_bytes
from edge.tokenizer import Tokenizer
base = [f"t{i:06d}" for i in range(100000)]
vocab = {token: i for i, token in enumerate(base + ["x"] + [b + "x" for b in base])}
doc = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": [f"{b} x" for b in base]}}
fd, path = tempfile.mkstemp(suffix=".json")
with os.fdopen(fd, "w") as f:
    json.dump(doc, f)
del base, vocab, doc
before = anon_bytes()
tok = Tokenizer(path) if sys.argv[1] == "edge" else tokenizers.Tokenizer.from_file(path)
print(anon_bytes() - before)
os.remove(path)
"""
    kept = {how: int(subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                                    check=True).stdout) for how in ("edge", "plain")}
    assert kept["edge"] < kept["plain"] - 8 * 2**20, kept
