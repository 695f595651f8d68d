"""edge.QMatMul numerics: float64 reference, weights as inputs, batch invariance, shapes, bad input.

On the CPU; test_the_cuda_kernel_passes_the_same_tests runs the file again with EDGE_TEST_DEVICE=cuda where a GPU
is there (tests marked cpu_only check the CPU kernels themselves or host-side checks, and are skipped in that run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
import pytest

import edge.kernels as ek
from edge.errors import EdgeError
from edge.kernels.graph import TOP, qmatmul_model, with_top
from kernels_util import (DEVICE, QMatMulRunner, assert_close_to_reference, cuda_available, ensure_library,
                          make_weight, run_test_file)

ROWS = (1, 2, 3, 4, 5, 8, 9, 17, 64)
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="the CPU kernels or host-side checks")


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group", [16, 32, 64, 128])
@pytest.mark.parametrize("outliers", [0, 40])
def test_matches_float64_reference(bits: int, group: int, outliers: int) -> None:
    # N=45 leaves a partial tile (and an odd tile count), K=200 a partial last group for every group size but 16/...
    rng = np.random.default_rng(1000 * bits + group + outliers)
    k = 200 if group != 16 else 208
    packed, w = make_weight(rng, 45, k, bits, group, zeros="uint8", outliers=outliers)
    bias = rng.standard_normal(45).astype(np.float32)
    run = QMatMulRunner(packed, bias)
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, bias)


@pytest.mark.parametrize("zeros", ["none", "float32", "scales16", "mins32", "mins16", "two-level", "two-level-scales"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_zero_point_kinds(bits: int, zeros: str) -> None:
    rng = np.random.default_rng(bits)
    packed, w = make_weight(rng, 24, 96, bits, 32, zeros=zeros)
    run = QMatMulRunner(packed)
    for m in (1, 5):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        assert_close_to_reference(run(x), x, w, None)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_float16_statistics_are_their_float32_values(bits: int, accuracy_level: int) -> None:
    """float16 scales and mins are widened exactly: bitwise the op with the same values in float32 (a wrong lane
    order or conversion in any kernel's float16 load fails this), and mins are W = code * scale + min."""
    rng = np.random.default_rng(60 + bits)
    half, w = make_weight(rng, 40, 160, bits, 32, zeros="mins16", outliers=10)
    full = ek.PackedWeight(**{**half.__dict__, "scales": half.scales.astype(np.float32),
                              "mins": half.mins.astype(np.float32)})
    x = rng.standard_normal((9, 160)).astype(np.float32)
    y = QMatMulRunner(half, accuracy_level=accuracy_level)(x)
    np.testing.assert_array_equal(y, QMatMulRunner(full, accuracy_level=accuracy_level)(x))
    if accuracy_level == 0:
        assert_close_to_reference(y, x, w, None)


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_two_level_statistics_are_their_expanded_values(bits: int, accuracy_level: int) -> None:
    """SpQR's second level (a byte per scale and zero point) gives bitwise the op with the expanded float32
    statistics, for any number of rows, in calls spanning several blocks of expanded tiles (N = 300: 38 tiles),
    rows still batch-invariant; weights as inputs too."""
    rng = np.random.default_rng(80 + bits)
    two, w = make_weight(rng, 300, 128, bits, 16, zeros="two-level", outliers=12)
    expanded = ek.PackedWeight(**{**two.__dict__, "scale_stats": None, "zero_stats": None, "stat_rows": None,
                                  "scales": _expand(two, two.scales, two.scale_stats),
                                  "zeros": _expand(two, two.zeros, two.zero_stats)})
    bias = rng.standard_normal(300).astype(np.float32)
    x = rng.standard_normal((17, 128)).astype(np.float32)
    run = QMatMulRunner(two, bias, accuracy_level=accuracy_level)
    y = run(x)
    np.testing.assert_array_equal(y, QMatMulRunner(expanded, bias, accuracy_level=accuracy_level)(x))
    np.testing.assert_array_equal(np.concatenate([run(x[i : i + 1]) for i in range(17)]), y)
    np.testing.assert_array_equal(QMatMulRunner(two, bias, weights_as_inputs=True, accuracy_level=accuracy_level)(x), y)
    if accuracy_level == 0:
        assert_close_to_reference(y, x, w, bias)


def _expand(p: ek.PackedWeight, codes8: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """Two-level statistics in the (tiles, groups, 8) layout as float32 values (base + step * code)."""
    rows = np.repeat(p.stat_rows, 4).reshape(-1, 8)  # (tiles, 8)
    base = stats[rows, :, 0].astype(np.float32).transpose(0, 2, 1)
    step = stats[rows, :, 1].astype(np.float32).transpose(0, 2, 1)
    return base + step * codes8.astype(np.float32)


@cpu_only
def test_bad_stat_rows_are_a_clear_error() -> None:
    rng = np.random.default_rng(5)
    two, _ = make_weight(rng, 32, 64, 4, 16, zeros="two-level")
    bad = ek.PackedWeight(**{**two.__dict__, "stat_rows": np.full_like(two.stat_rows, 7)})
    with pytest.raises(Exception, match=r"stat_rows\[0\] = 7 is outside \[0, 2\)"):
        QMatMulRunner(bad)(np.ones((1, 64), np.float32))
    both = ek.PackedWeight(**{**two.__dict__, "mins": np.zeros(two.scales.shape, np.float16)})
    with pytest.raises(Exception, match="mins do not combine with two-level statistics"):
        QMatMulRunner(both)(np.ones((1, 64), np.float32))
    orphan = ek.PackedWeight(**{**two.__dict__, "scale_stats": None})
    with pytest.raises(Exception, match="zero_stats and stat_rows need scale_stats"):
        QMatMulRunner(orphan)(np.ones((1, 64), np.float32))
    with pytest.raises(EdgeError, match="share their stat row"):
        ek.pack_two_level(np.zeros((32, 64), np.uint8), ek.TwoLevel(
            scale_codes=np.zeros((32, 4), np.uint8), scale_stats=np.ones((2, 4, 2), np.float16),
            rows=np.arange(32) % 2), bits=4, group_size=16)


def test_mins_mean_code_times_scale_plus_min() -> None:
    """Unit rows of x read W's columns back: W = code * scale + min, exactly (GGUF Q4_1's numbers)."""
    codes = np.arange(16 * 64).reshape(16, 64) % 16
    scales = np.full((16, 2), 0.5, np.float16)
    mins = np.full((16, 2), -3.0, np.float16)
    packed = ek.pack(codes, scales, bits=4, group_size=32, mins=mins)
    np.testing.assert_array_equal(QMatMulRunner(packed)(np.eye(64, dtype=np.float32)), (codes * 0.5 - 3.0).T)
    with pytest.raises(EdgeError, match="zeros or mins"):
        ek.pack(codes, scales, np.zeros((16, 2), np.uint8), bits=4, group_size=32, mins=mins)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_weights_as_inputs_equal_constant_bitwise(bits: int) -> None:
    rng = np.random.default_rng(7 + bits)
    packed, _ = make_weight(rng, 40, 160, bits, 32, outliers=10)
    bias = rng.standard_normal(40).astype(np.float32)
    const, fed = QMatMulRunner(packed, bias), QMatMulRunner(packed, bias, weights_as_inputs=True)
    assert fed.feeds, "the fed model must take its weights as graph inputs"
    for m in (1, 8, 17):
        x = rng.standard_normal((m, 160)).astype(np.float32)
        np.testing.assert_array_equal(const(x), fed(x))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_batch_invariance(bits: int) -> None:
    """Row i of an M-row call is bitwise the M=1 result for that row, for any M and any other rows."""
    rng = np.random.default_rng(11 + bits)
    packed, _ = make_weight(rng, 72, 192, bits, 32, outliers=20)
    run = QMatMulRunner(packed, rng.standard_normal(72).astype(np.float32))
    x = rng.standard_normal((64, 192)).astype(np.float32)
    singles = np.concatenate([run(x[i : i + 1]) for i in range(64)])
    for m in (2, 3, 8, 9, 17, 64):
        np.testing.assert_array_equal(run(x[:m]), singles[:m])
    other = rng.standard_normal((8, 192)).astype(np.float32)
    other[3] = x[5]
    np.testing.assert_array_equal(run(other)[3], singles[5])


def int8_activations(x: np.ndarray, group: int) -> np.ndarray:
    """x as accuracy_level 4 sees it: per row and group x_int = round(x * 127/amax), ties to even, times amax/127
    (float32 steps, as the kernels' prepare_digits)."""
    xs = x.reshape(len(x), -1, group)
    amax = np.abs(xs).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    x_int = np.clip(np.rint(xs * (np.float32(127) / safe)), -127, 127)
    step = np.where(amax > 0, amax / np.float32(127), np.float32(0))
    return (x_int.astype(np.float64) * step.astype(np.float64)).reshape(x.shape)


@cpu_only
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", ["uint8", "float32", "mins16"])
def test_int8_activations_are_exact_on_rounded_x_and_batch_invariant(group: int, zeros: str) -> None:
    """accuracy_level 4: x rounded to int8 per row and group. Within 2% of the float x's result, bitwise
    batch-invariant, and, on the integer kernels, within 1e-5 of the float64 product with x so rounded: the integer
    sums are exact (no 16-bit saturation, digits paired with the right codes), only x's rounding differs."""
    rng = np.random.default_rng(group)
    packed, w = make_weight(rng, 72, 256, 4, group, zeros=zeros)
    bias = rng.standard_normal(72).astype(np.float32)
    fast = QMatMulRunner(packed, bias, accuracy_level=4)
    x = rng.standard_normal((17, 256)).astype(np.float32) * rng.uniform(0.1, 10, (17, 1)).astype(np.float32)
    x[3, :group] = 0.0  # an all-zero group
    y = fast(x)
    assert_close_to_reference(y, x, w, bias, rtol=2e-2)
    np.testing.assert_array_equal(np.concatenate([fast(x[i : i + 1]) for i in range(17)]), y)
    for m in range(2, 17):  # every split into blocks of 8 and 4 rows and their remainders
        np.testing.assert_array_equal(fast(x[:m]), y[:m])
    if ek.kernel_isa(4, accuracy_level=4) != "portable":  # the portable kernel ignores the level
        assert_close_to_reference(y, int8_activations(x, group), w, bias, rtol=1e-5)
        with pytest.raises(AssertionError):
            assert_close_to_reference(y, x, w, bias, rtol=1e-5)


@cpu_only
def test_int8_activations_worst_case_sums() -> None:
    """The largest integer sums the int8 kernels form (every code 15, every x at +-127): still exact, so the
    16-bit partial sums of the AVX2 kernel cannot have saturated or wrapped."""
    n, k, group = 16, 256, 128
    codes = np.full((n, k), 15, np.uint8)
    scales = np.full((n, k // group), 0.5, np.float32)
    packed = ek.pack(codes, scales, np.zeros((n, k // group), np.uint8), bits=4, group_size=group)
    w = ek.dequantize(packed, codes)
    x = np.stack([np.full(k, 3.0, np.float32), np.full(k, -3.0, np.float32)])
    y = QMatMulRunner(packed, accuracy_level=4)(x)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=1e-6)


def test_rank3_input_and_single_thread_match() -> None:
    rng = np.random.default_rng(3)
    packed, w = make_weight(rng, 64, 128, 4, 32)
    x = rng.standard_normal((1, 6, 128)).astype(np.float32)
    y3 = QMatMulRunner(packed, rank3=True)(x)
    assert y3.shape == (1, 6, 64)
    np.testing.assert_array_equal(y3[0], QMatMulRunner(packed, threads=1)(x[0]))
    assert_close_to_reference(y3[0], x[0], w, None)


def test_large_call_uses_threads_and_stays_exact() -> None:
    """A call big enough to be split across threads gives the same bits as a single-threaded session."""
    rng = np.random.default_rng(5)
    packed, w = make_weight(rng, 1000, 576, 4, 32)
    x = rng.standard_normal((4, 576)).astype(np.float32)
    y2 = QMatMulRunner(packed, threads=2)(x)
    np.testing.assert_array_equal(y2, QMatMulRunner(packed, threads=1)(x))
    assert_close_to_reference(y2, x, w, None)


@cpu_only
def test_empty_batch() -> None:
    packed, _ = make_weight(np.random.default_rng(0), 16, 64, 4, 32)
    assert QMatMulRunner(packed)(np.zeros((0, 64), np.float32)).shape == (0, 16)


def _session_with_free_weight_shapes(packed) -> ort.InferenceSession:
    """Weights as graph inputs of unknown shape, so wrong sizes reach the kernel's own checks."""
    import edge.kernels as ek

    ensure_library()
    model, _ = qmatmul_model(packed, ["M", packed.k], weights_as_inputs=True)
    for value in model.graph.input[1:]:
        value.type.tensor_type.ClearField("shape")
    so = ort.SessionOptions()
    ek.register(so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _feeds(packed) -> dict[str, np.ndarray]:
    from edge.kernels.graph import qmatmul_tensors

    return {"X": np.ones((1, packed.k), np.float32), **qmatmul_tensors(packed, "w")}


@cpu_only
def test_wrong_scales_size_is_a_clear_error() -> None:
    packed, _ = make_weight(np.random.default_rng(0), 16, 64, 4, 32)
    feeds = _feeds(packed)
    feeds["w.scales"] = np.ones(3, np.float32)
    with pytest.raises(Exception, match=r"input 'scales' has 3 elements, expected 32"):
        _session_with_free_weight_shapes(packed).run(None, feeds)


@cpu_only
def test_bad_outliers_are_a_clear_error() -> None:
    packed, _ = make_weight(np.random.default_rng(0), 16, 64, 4, 32, outliers=3)
    sess = _session_with_free_weight_shapes(packed)
    feeds = _feeds(packed)
    feeds["w.outlier_cols"] = np.array([0, 1, 64], np.int32)
    with pytest.raises(Exception, match=r"outlier column 64 is outside \[0, K\)"):
        sess.run(None, feeds)
    feeds = _feeds(packed)
    del feeds["w.outlier_row_ptr"]
    with pytest.raises(Exception, match="w.outlier_row_ptr"):
        sess.run(None, feeds)


def check_row_tops() -> None:
    """Output 2 (top = 1) against numpy: each row's first argmax and its maximum exactly, ties included."""
    rng = np.random.default_rng(7)
    n, k = 3001, 64  # 376 tiles in 8 chunks, the last tile partial
    codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(n, 2)).astype(np.float32)
    zeros = rng.integers(0, 16, size=(n, 2)).astype(np.uint8)
    x = rng.standard_normal((40, k)).astype(np.float32) * 3
    x[-1] = 0.0  # every column 0: column 0 wins
    first = (x[:2] @ ek.dequantize(ek.pack(codes, scales, zeros, bits=4, group_size=32), codes).T).argmax(1)
    assert first[0] < n - 1 and first[1] < n - 2 and first[1] + 1 != first[0]
    # each of the first two rows' maximum copied to a later column: the last (another chunk), and the next one
    for copy, source in ((n - 1, first[0]), (first[1] + 1, first[1])):
        codes[copy], scales[copy], zeros[copy] = codes[source], scales[source], zeros[source]
    model, _ = qmatmul_model(ek.pack(codes, scales, zeros, bits=4, group_size=32), ["M", k])
    assert with_top(list(model.graph.node), "Y")
    model.graph.output.append(helper.make_tensor_value_info(TOP, TensorProto.FLOAT, ["M", 2]))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ek.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y, tops = sess.run(None, {"X": x})
    assert y[0, first[0]] == y[0, n - 1] and y[1, first[1]] == y[1, first[1] + 1], "the columns do not tie"
    assert list(tops[:2, 0]) == list(first) and tops[-1, 0] == 0
    np.testing.assert_array_equal(tops[:, 0], y.argmax(1))
    np.testing.assert_array_equal(tops[:, 1], y.max(1))


@cpu_only
def test_row_tops_are_numpys_argmax_and_maximum() -> None:
    ensure_library()
    check_row_tops()


@cpu_only
@pytest.mark.parametrize("n,attribute,value,message", [
    (16, "bits", 5, "bits must be 2, 3, 4 or 8"),
    (16, "accuracy_level", 2, "accuracy_level must be 0"),
    (16, "activation", 3, "activation must be 0"),
    (12, "activation", 1, "multiple of 8"),  # a gated activation needs whole tiles of 4 gate and 4 up rows
    (16, "top", 2, "top must be 0 or 1"),
])
def test_bad_attribute_fails_at_session_creation(n: int, attribute: str, value: int, message: str) -> None:
    ensure_library()
    packed, _ = make_weight(np.random.default_rng(0), n, 64, 4, 32)
    model, _ = qmatmul_model(packed, ["M", 64])
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != attribute]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(attribute, value)])
    so = ort.SessionOptions()
    ek.register(so)
    with pytest.raises(Exception, match=message):
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


_ISA_SCRIPT = """
import json, sys
import numpy as np
from kernels_util import QMatMulRunner, make_weight, assert_close_to_reference
out = {}
for bits in (2, 3, 4, 8):
    rng = np.random.default_rng(bits)
    packed, w = make_weight(rng, 45, 200, bits, 32, outliers=15)
    bias = rng.standard_normal(45).astype(np.float32)
    run = QMatMulRunner(packed, bias)
    x = rng.standard_normal((9, 200)).astype(np.float32)
    y = run(x)
    assert_close_to_reference(y, x, w, bias)
    np.testing.assert_array_equal(np.concatenate([run(x[i:i + 1]) for i in range(9)]), y)
    out[bits] = y.tobytes().hex()
    if bits == 4:
        fast = QMatMulRunner(packed, bias, accuracy_level=4)
        y = fast(x)
        assert_close_to_reference(y, x, w, bias, rtol=2e-2)
        np.testing.assert_array_equal(np.concatenate([fast(x[i:i + 1]) for i in range(9)]), y)
        out["4-int8"] = y.tobytes().hex()
    packed, w = make_weight(rng, 45, 200, bits, 32, zeros="mins16")
    for level in (0, 4):
        y = QMatMulRunner(packed, bias, accuracy_level=level)(x)
        assert_close_to_reference(y, x, w, bias, rtol=1e-5 if level == 0 else 2e-2)
        out[f"{bits}-mins16-{level}"] = y.tobytes().hex()
    packed, w = make_weight(rng, 45, 200, bits, 16 if bits != 4 else 32, zeros="two-level")
    y = QMatMulRunner(packed, bias)(x)
    assert_close_to_reference(y, x, w, bias)
    out[f"{bits}-two-level"] = y.tobytes().hex()
from test_kernels import check_row_tops
check_row_tops()  # this path's own row tops (row_top or row_top_avx2)
print(json.dumps(out))
"""


def _run_isa(isa: str | None) -> dict:
    env = dict(os.environ)
    env.pop("EDGE_KERNELS_ISA", None)
    if isa:
        env["EDGE_KERNELS_ISA"] = isa
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join([str(here), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], env=env, cwd=here, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@cpu_only
def test_portable_and_vector_paths_are_each_exact_and_batch_invariant() -> None:
    """Each code path (portable, AVX2, AVX-512, the integer VNNI kernels for 4-bit) meets the reference and batch
    invariance. Paths sharing their per-lane arithmetic agree bitwise: fp32 AVX2 with fp32 AVX-512, AVX-VNNI with
    AVX-512 VNNI (whose scalar and vector digit preparations must then agree too). A cap the CPU lacks falls back
    to the best path, which keeps these comparisons valid on any machine."""
    ensure_library()
    runs = {isa: _run_isa(isa) for isa in (None, "avx512vnni", "avxvnni", "avx512", "avx2", "portable")}
    assert runs["avx512"] == runs["avx2"]
    assert runs["avxvnni"]["4"] == runs["avx512vnni"]["4"] == runs[None]["4"]
    assert runs["avxvnni"]["4-int8"] == runs["avx512vnni"]["4-int8"] == runs[None]["4-int8"] == runs["avx2"]["4-int8"]
    assert runs[None]["2"] == runs["avx2"]["2"] and runs[None]["3"] == runs["avx2"]["3"]
    assert runs[None]["8"] == runs["avx2"]["8"] == runs["avx512"]["8"]
    for key in ("2-mins16-0", "3-mins16-0"):  # float16 statistics: the same agreements
        assert runs["avx512"][key] == runs["avx2"][key] == runs[None][key]
    assert runs["avxvnni"]["4-mins16-0"] == runs["avx512vnni"]["4-mins16-0"] == runs[None]["4-mins16-0"]
    assert runs["avxvnni"]["4-mins16-4"] == runs["avx512vnni"]["4-mins16-4"] == runs["avx2"]["4-mins16-4"]
    assert runs["avx512"]["3-two-level"] == runs["avx2"]["3-two-level"] == runs[None]["3-two-level"]
    assert runs["avxvnni"]["4-two-level"] == runs["avx512vnni"]["4-two-level"] == runs[None]["4-two-level"]


@pytest.mark.parametrize("bad", [np.inf, np.nan])
@pytest.mark.parametrize("bits", [3, 4])
def test_non_finite_row_stays_in_its_row(bits: int, bad: float) -> None:
    rng = np.random.default_rng(2)
    packed, _ = make_weight(rng, 16, 64, bits, 32)
    run = QMatMulRunner(packed)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 37] = bad
    y = run(x)
    assert not np.isfinite(y[1]).all()
    np.testing.assert_array_equal(y[[0, 2]], np.concatenate([run(x[:1]), run(x[2:])]))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_float16_activations_are_the_float32_op_rounded_once(bits: int, accuracy_level: int) -> None:
    """float16 X and Y (the op's second registration, picked by X's type): widened exactly, computed in float32,
    rounded to nearest once, so bitwise the float32 op's result on the same values, rounded; batch-invariant."""
    rng = np.random.default_rng(40 + bits)
    packed, w = make_weight(rng, 45, 200, bits, 32, outliers=15)
    bias = rng.standard_normal(45).astype(np.float32)
    half = QMatMulRunner(packed, bias, float16=True, accuracy_level=accuracy_level)
    full = QMatMulRunner(packed, bias, accuracy_level=accuracy_level)
    x = rng.standard_normal((9, 200)).astype(np.float16)
    y = half(x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, full(x.astype(np.float32)).astype(np.float16))
    np.testing.assert_array_equal(np.concatenate([half(x[i : i + 1]) for i in range(9)]), y)
    if accuracy_level == 0:
        assert_close_to_reference(y.astype(np.float32), x.astype(np.float32), w, bias, rtol=2e-3)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return np.float32(0.5) * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x ** 3)))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("gated", [1, 2])
@pytest.mark.parametrize("n", [48, 44])
def test_gated_activation_fuses_split_activation_and_mul(bits: int, accuracy_level: int, gated: int, n: int) -> None:
    """activation=1 (silu) or 2 (gelu_tanh): Y = act(gate) * up from one call over interleaved rows, each element
    computed from the same float32 gate and up values as the plain op gives for those rows; batch-invariant; float16
    too. n = 44 gives an odd number of tiles (the AVX-512 epilogues run tiles and rows in pairs)."""
    from edge.kernels.pack import interleave_gated

    rng = np.random.default_rng(60 + bits)
    k = 160
    codes = rng.integers(0, 1 << bits, size=(2, n, k)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(2, n, k // 32)).astype(np.float32)
    zeros = rng.integers(0, 1 << bits, size=(2, n, k // 32)).astype(np.uint8)
    fused = [interleave_gated(a[0], a[1]) for a in (codes, scales, zeros)]
    packed = ek.pack(*fused, bits=bits, group_size=32)
    bias = rng.standard_normal(2 * n).astype(np.float32)
    run = QMatMulRunner(packed, bias, accuracy_level=accuracy_level, gated=gated)
    plain = QMatMulRunner(packed, bias, accuracy_level=accuracy_level)
    x = rng.standard_normal((9, k)).astype(np.float32)
    y = run(x)
    assert y.shape == (9, n)
    both = plain(x).reshape(9, n // 4, 2, 4)  # per tile: 4 gate columns, then their 4 up columns
    gate, up = both[:, :, 0].reshape(9, n), both[:, :, 1].reshape(9, n)
    act = gate / (np.float32(1) + np.exp(-gate)) if gated == 1 else gelu_tanh(gate)
    np.testing.assert_allclose(y, act * up, rtol=1e-5, atol=1e-5)  # gelu_tanh cancels for very negative gates  # the plain op itself meets the float64 reference
    np.testing.assert_array_equal(np.concatenate([run(x[i : i + 1]) for i in range(9)]), y)
    half = QMatMulRunner(packed, bias, accuracy_level=accuracy_level, gated=gated, float16=True)
    x16 = x.astype(np.float16)
    np.testing.assert_array_equal(half(x16), run(x16.astype(np.float32)).astype(np.float16))


@pytest.mark.skipif(DEVICE != "cpu" or not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA build")
def test_the_cuda_kernel_passes_the_same_tests() -> None:
    run_test_file(__file__, EDGE_TEST_DEVICE="cuda")
