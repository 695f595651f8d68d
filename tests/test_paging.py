"""Weight paging: logits equal the resident graph's, the window holds at most W layers, reads overlap compute."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edge.errors import PackageError
from edge.export.paged import export_paged
from edge.export.pipeline import export_model
from edge.model import MASKED, Decoder
from edge.package import load_package
from edge.paging import PagedDecoder, read_into
from tiny_models import max_rel_error, reference_logits, tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 5-layer tiny Llama exported both ways: (torch model, resident package, paged package)."""
    root = tmp_path_factory.mktemp("paging")
    model, imported = tiny_llama(seed=7, num_hidden_layers=5)
    resident = load_package(export_model("tiny", root / "resident", quant="fp32", model=imported))
    return model, resident, load_package(export_paged(imported, root / "paged"))


def paged(package, **kw) -> PagedDecoder:
    return PagedDecoder(package, context_length=64, threads=1, max_tokens=32, **kw)


def run_steps(decoder, ids: list[int]) -> list[np.ndarray]:
    """A 12-token prompt (all rows), then one decode step per remaining token."""
    out = [decoder.step(ids[:12], logits_rows=list(range(12))).copy()]
    out += [decoder.step([t]).copy() for t in ids[12:]]
    return out


IDS = [int(t) for t in np.random.default_rng(3).integers(0, 96, 18)]


@pytest.mark.parametrize("window, pinned", [(2, 0), (3, 0), (2, 2), (5, 0)])
def test_paged_logits_equal_resident_logits(tiny, window, pinned):
    model, resident, package = tiny
    expected = run_steps(Decoder(resident, context_length=64, threads=1), IDS)
    decoder = paged(package, window=window, pinned=pinned)
    try:
        got = run_steps(decoder, IDS)
    finally:
        decoder.close()
    for a, b in zip(got, expected):
        assert max_rel_error(a, b) < 2e-6  # the same weights; only the last norm's fusion differs
    assert max_rel_error(np.concatenate([got[0], *got[1:]]), reference_logits(model, IDS)) < 1e-4


def test_window_size_does_not_change_a_single_bit(tiny):
    _, _, package = tiny
    results = []
    for window, pinned in [(2, 0), (4, 1)]:
        decoder = paged(package, window=window, pinned=pinned)
        results.append(run_steps(decoder, IDS))
        decoder.close()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("variant", [dict(qkv_bias=True), dict(tie=False)], ids=["qwen2", "untied"])
def test_paged_variants_match_transformers(tmp_path, variant):
    model, imported = tiny_llama(seed=2, **variant)
    decoder = paged(load_package(export_paged(imported, tmp_path / "p")))
    got = decoder.step(IDS, logits_rows=list(range(len(IDS))))
    assert max_rel_error(got, reference_logits(model, IDS)) < 1e-4
    decoder.close()


def test_tree_step_matches_the_resident_graph(tiny):
    _, resident, package = tiny
    bias = np.zeros((1, 1, 3, 8), np.float32)
    bias[0, 0, 2, 6] = MASKED  # node 2 is a sibling of node 1, not its child
    rows = []
    for decoder in (Decoder(resident, context_length=64, threads=1), paged(package)):
        decoder.step(IDS[:5])
        rows.append(decoder.step([7, 8, 9], positions=[5, 6, 6], logits_rows=[0, 1, 2], attention_bias=bias).copy())
    assert max_rel_error(rows[1], rows[0]) < 2e-6


def intervals(trace) -> list[tuple[float, float]]:
    """[read start, compute end] of every visit: how long each layer's weights occupied a slot."""
    reads = [e for e in trace if e[0] == "read"]
    computes = [e for e in trace if e[0] == "compute"]
    return [(r[2], c[3]) for r, c in zip(reads, computes)]


def test_window_never_holds_more_than_w_layers(tiny):
    _, _, package = tiny
    decoder = paged(package, window=2, trace=True)
    run_steps(decoder, IDS)
    spans = intervals(decoder.trace)
    assert decoder.stats()["max_in_use"] == 2 and decoder.resident_layers == 2
    assert decoder.window.slots.shape[0] == 2
    decoder.close()
    assert len(spans) == 5 * 7  # every paged layer was read again in every pass: 5 layers > 2 slots
    for start, _ in spans:
        held = sum(1 for s, e in spans if s <= start < e)
        assert held <= 2


class SlowCompute(PagedDecoder):
    def _bind_layer(self, layer, n, weights):
        super()._bind_layer(layer, n, weights)
        time.sleep(0.03)


def slow_read(fd, buffer, offset):
    time.sleep(0.03)
    read_into(fd, buffer, offset)


def test_reading_overlaps_compute(tiny):
    _, _, package = tiny
    decoder = SlowCompute(package, context_length=64, threads=1, window=2, reader=slow_read, trace=True)
    decoder.step([1, 2, 3])
    time.sleep(0.1)  # the reader fills the window for the next pass
    start = time.perf_counter()
    for t in range(3):
        decoder.step([t])
    total = time.perf_counter() - start
    decoder.close()
    trace = [e for e in decoder.trace if e[3] > start]
    serial = sum(e[3] - e[2] for e in trace)
    assert total < 0.8 * serial, (total, serial)
    reads = [e for e in trace if e[0] == "read"]
    computes = [e for e in trace if e[0] == "compute"]
    overlapped = sum(1 for c in computes if any(r[2] < c[3] and r[3] > c[2] for r in reads))
    assert overlapped >= len(computes) - 2  # all but the pass's edges compute while a read runs


def test_an_interrupted_pass_keeps_the_window_aligned(tiny):
    _, resident, package = tiny
    decoder = paged(package)
    decoder.step(IDS[:4])
    with pytest.raises(Exception):
        decoder.step([1, 2], attention_bias=np.zeros((1, 1, 5, 5), np.float32))  # wrong shape: ORT fails mid-pass
    decoder.cache.trim(4)
    got = decoder.step([IDS[4]]).copy()
    decoder.close()
    reference = Decoder(resident, context_length=64, threads=1)
    reference.step(IDS[:4])
    assert max_rel_error(got, reference.step([IDS[4]])) < 2e-6


def test_reader_errors_reach_the_caller(tiny):
    _, _, package = tiny

    def broken(fd, buffer, offset):
        raise OSError("disk gone")

    decoder = paged(package, reader=broken)
    with pytest.raises(OSError, match="disk gone"):
        decoder.step([1])
    decoder.close()


def test_resident_package_and_bad_sizes_are_refused(tiny):
    _, resident, package = tiny
    with pytest.raises(PackageError, match="not a paged package"):
        PagedDecoder(resident)
    decoder = paged(package)
    with pytest.raises(ValueError, match="max_tokens"):
        decoder.step(list(range(40)))
    decoder.close()
    with pytest.raises(ValueError, match="pinned"):
        paged(package, pinned=6)


def test_default_model_paged_equals_resident(smollm2, tmp_path):
    """SmolLM2-135M's float weights (from the GGUF), paged with 2 of 30 layers in memory, against the cached
    resident fp32 package of the same GGUF."""
    from edge.default_model import default_package

    resident = Decoder(load_package(default_package("fp32"), verify=False), context_length=64, threads=2)
    package = load_package(export_paged(smollm2, tmp_path / "p", rope_cache_len=256), verify=False)
    decoder = PagedDecoder(package, context_length=64, threads=2, window=2, max_tokens=16)
    ids = [1, 504, 3458, 282, 4649, 314, 260, 1345]
    assert max_rel_error(decoder.step(ids).copy(), resident.step(ids)) < 1e-5
    for t in (28, 339, 1070):
        assert max_rel_error(decoder.step([t]).copy(), resident.step([t])) < 1e-5
    decoder.close()


def test_engine_generates_the_same_text_from_a_paged_package(tiny):
    from edge.engine import Engine

    _, resident, package = tiny
    engines = [Engine(p, context_length=64, threads=1) for p in (resident, package)]
    assert isinstance(engines[1].decoder, PagedDecoder) and not isinstance(engines[0].decoder, PagedDecoder)
    texts = [e.generate(IDS[:6], max_tokens=8) for e in engines]
    assert texts[0] == texts[1] and texts[0]
    engines[1].decoder.close()


def test_paging_section_may_only_name_package_files(tiny):
    from edge.package import Package

    _, _, package = tiny
    manifest = dict(package.manifest, paging=dict(package.manifest["paging"], layer_data="../../etc/passwd"))
    with pytest.raises(PackageError, match="not one of the package's files"):
        PagedDecoder(Package(package.root, manifest))


def test_a_dropped_decoder_stops_its_reader(tiny):
    import gc

    decoder = paged(tiny[2])
    decoder.step([1, 2])
    thread = decoder.window._thread
    del decoder
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
