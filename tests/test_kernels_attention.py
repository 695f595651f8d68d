"""edge.Attention: GroupQueryAttention's contract, with rows that do not depend on how many share the call.

EDGE_TEST_DEVICE=cuda runs edge.Attention's sessions on the CUDAExecutionProvider (test_the_cuda_kernel_passes_the_
same_tests does, where onnxruntime-gpu sees a GPU); GroupQueryAttention stays on the CPU (no float32 CUDA kernel).
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import edge.kernels as ek
from edge.kernels.graph import attention_model
from kernels_util import cuda_available, ensure_library, run_test_file

# The runtime's "not an ancestor" (edge.model.MASKED), not imported: the ABI matrix (.ci/abi-matrix) runs this file
# with onnxruntime, numpy and onnx only.
MASKED = np.float32(-1e9)

H, KV, D, L = 6, 2, 32, 96  # three query heads per kv head, as in SmolLM2 (9/3)
DEVICE = os.environ.get("EDGE_TEST_DEVICE", "cpu")
# SmolLM2's heads with a past of 200: the CPU kernel's tasks then hold several rows that share 64-key blocks of the
# cache (attention.h, kMaxTaskRows), windows cut those blocks at a different key for each row.
LONG = {"heads": (9, 3, 64), "capacity": 320}
# A past whose rows are attended in two halves of their keys (kSplitKeys, 384): every row of a call from 2 to 8 tokens
# then shares one task per kv head and half (attention_op.cc, rows_per_task).
SPLIT = {"heads": (9, 3, 64), "capacity": 720}


class Attention:
    """One session of the one-node model; the cache is a pair of numpy arrays bound as past and present at once,
    as the runtime binds its KV cache (in place), unless in_place=False."""

    def __init__(self, packed: bool = True, bias: bool = True, stock: bool = False, threads: int = 2,
                 in_place: bool = True, window: int = 0, heads: tuple[int, int, int] = (H, KV, D), capacity: int = L,
                 norms: tuple[np.ndarray, np.ndarray] | None = None, half: bool = False):
        ensure_library()
        self.H, self.KV, self.D = heads
        self.scale = self.D ** -0.5
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.device = ("cuda", 0) if DEVICE == "cuda" and not stock else ("cpu", 0)
        ek.register(so, cuda=self.device[0] == "cuda")
        providers = ["CPUExecutionProvider"]
        if self.device[0] == "cuda":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # the CUDA kernel, or an error
            providers = ["CUDAExecutionProvider"]
        model = attention_model(*heads, packed=packed, bias=bias, stock=stock, scale=self.scale, window=window,
                                qk_norm=norms is not None, kv_dtype="float16" if half else "float32")
        self.window, self.norms = window, norms
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
        self.packed, self.bias, self.in_place = packed, bias, in_place
        rng = np.random.default_rng(1)
        angles = np.outer(np.arange(max(256, capacity)), 1.0 / 10000 ** (np.arange(0, self.D, 2) / self.D))
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        dtype = np.float16 if half else np.float32
        self.cache = [rng.standard_normal((1, self.KV, capacity, self.D)).astype(dtype) for _ in range(2)]

    def __call__(self, q, k, v, past: int, positions, bias=None) -> np.ndarray:
        s = q.shape[0]
        feeds = {"seqlens_k": np.array([past + s - 1], np.int32), "total_sequence_length": np.array(past + s, np.int32),
                 "cos_cache": self.cos, "sin_cache": self.sin,
                 "position_ids": np.asarray(positions, np.int64).reshape(1, s)}
        if self.packed:
            feeds["query"] = np.concatenate([q, k, v], axis=1)[None]
        else:
            feeds.update(query=q[None], key=k[None], value=v[None])
        if self.bias:
            feeds["attention_bias"] = (np.zeros((1, 1, s, past + s), np.float32) if bias is None else bias)
        if self.norms is not None:
            feeds["q_norm"], feeds["k_norm"] = self.norms
        io = self.sess.io_binding()
        for name, value in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(value))
        out = np.full((1, s, self.H * self.D), np.nan, np.float32)
        y = ort.OrtValue.ortvalue_from_numpy(out, *self.device)  # on the CPU: wraps `out` without a copy
        io.bind_ortvalue_output("output", y)
        values = [ort.OrtValue.ortvalue_from_numpy(a, *self.device) for a in self.cache]
        for kind, value in zip(("key", "value"), values):
            io.bind_ortvalue_input(f"past_{kind}", value)
            if self.in_place:
                io.bind_ortvalue_output(f"present_{kind}", value)
            else:
                io.bind_output(f"present_{kind}", self.device[0])
        self.sess.run_with_iobinding(io)
        if not self.in_place:
            self.cache = [a.numpy() for a in io.get_outputs()[1:]]
        elif self.device[0] == "cuda":
            self.cache = [value.numpy() for value in values]
        return y.numpy()[0] if self.device[0] == "cuda" else out[0]


def rotate(x, positions, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[positions][:, None].astype(np.float64), sin[positions][:, None].astype(np.float64)
    a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def reference(att: Attention, cache_before, q, k, v, past, positions, bias=None):
    """float64: rotary on q and k, causal softmax over the past and the new rows (plus the bias), weighted values;
    with a window, a query at position p sees the keys p-window+1 .. p (GroupQueryAttention's local_window_size)."""
    s, (H, KV, D) = q.shape[0], (att.H, att.KV, att.D)
    pos = np.asarray(positions)
    keys = cache_before[0][0, :, :past].astype(np.float64)
    vals = cache_before[1][0, :, :past].astype(np.float64)
    k_new = rotate(k.reshape(s, KV, D), pos, att.cos, att.sin).transpose(1, 0, 2)
    keys = np.concatenate([keys, k_new], axis=1)
    vals = np.concatenate([vals, v.reshape(s, KV, D).transpose(1, 0, 2).astype(np.float64)], axis=1)
    qr = rotate(q.reshape(s, H, D), pos, att.cos, att.sin)
    out = np.zeros((s, H, D))
    for i in range(s):
        first = max(0, pos[i] - att.window + 1) if att.window else 0
        for h in range(H):
            g = h // (H // KV)
            scores = keys[g, first:past + i + 1] @ qr[i, h] * att.scale
            if bias is not None:
                scores = scores + bias[0, 0, i, first:past + i + 1]
            p = np.exp(scores - scores.max())
            out[i, h] = p @ vals[g, first:past + i + 1] / p.sum()
    return out.reshape(s, H * D), keys, vals


def rows(rng, s, heads: tuple[int, int, int] = (H, KV, D)):
    h, kv, d = heads
    return (rng.standard_normal((s, h * d)).astype(np.float32), rng.standard_normal((s, kv * d)).astype(np.float32),
            rng.standard_normal((s, kv * d)).astype(np.float32))


@pytest.mark.parametrize("packed,window", [(True, 0), (False, 0), (True, 11)])
@pytest.mark.parametrize("past,s,layout", [(0, 1, {}), (0, 9, {}), (37, 1, {}), (37, 7, {}), (60, 33, {}),
                                           (200, 1, LONG), (200, 9, LONG), (110, 30, LONG)])
def test_matches_float64_reference_and_writes_the_cache_in_place(packed, window, past, s, layout):
    att = Attention(packed=packed, window=window, **layout)
    rng = np.random.default_rng(past * 100 + s)
    q, k, v = rows(rng, s, (att.H, att.KV, att.D))
    before = [a.copy() for a in att.cache]
    positions = np.arange(past, past + s)
    out = att(q, k, v, past, positions)
    ref, keys, vals = reference(att, before, q, k, v, past, positions)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)
    np.testing.assert_allclose(att.cache[0][0, :, :past + s], keys, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(att.cache[1][0, :, past:past + s],
                                  v.reshape(s, att.KV, att.D).transpose(1, 0, 2))
    np.testing.assert_array_equal(att.cache[0][:, :, past + s:], before[0][:, :, past + s:])  # nothing else touched


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("past,s,layout,window", [(0, 1, {}, 0), (37, 7, {}, 11), (200, 1, LONG, 0), (200, 9, LONG, 0),
                                                  (110, 30, LONG, 64)])
def test_a_float16_cache_is_written_rounded_and_attended_as_read(past, s, layout, window, in_place):
    """kv_dtype float16: the new values are stored rounded to nearest (numpy's float16 cast), the rotated keys within
    one float16 step of the float64 rotation, nothing else is touched; the output is the float64 reference over the
    cache as stored."""
    att = Attention(half=True, window=window, in_place=in_place, **layout)
    rng = np.random.default_rng(past + s)
    q, k, v = rows(rng, s, (att.H, att.KV, att.D))
    before = [a.copy() for a in att.cache]
    positions = np.arange(past, past + s)
    out = att(q, k, v, past, positions)
    assert att.cache[0].dtype == np.float16
    _, keys, _ = reference(att, before, q, k, v, past, positions)
    stored = att.cache[0][0, :, past:past + s].astype(np.float64)
    assert (np.abs(stored - keys[:, past:]) <= np.spacing(np.abs(keys[:, past:]).astype(np.float16))).all()
    np.testing.assert_array_equal(att.cache[1][0, :, past:past + s],
                                  v.reshape(s, att.KV, att.D).transpose(1, 0, 2).astype(np.float16))
    np.testing.assert_array_equal(att.cache[0][:, :, :past], before[0][:, :, :past])
    if in_place:  # a present of its own holds only the past carried over and the new rows
        np.testing.assert_array_equal(att.cache[0][:, :, past + s:], before[0][:, :, past + s:])
    # The float64 reference over exactly what the kernel stored: the past as it was, the new keys and values as written.
    keys, vals = (a[0].astype(np.float64) for a in att.cache)
    qr = rotate(q.reshape(s, att.H, att.D), positions, att.cos, att.sin)
    for i in range(s):
        first = max(0, positions[i] - window + 1) if window else 0
        for h in range(att.H):
            g = h // (att.H // att.KV)
            p = np.exp((scores := keys[g, first:past + i + 1] @ qr[i, h] * att.scale) - scores.max())
            expected = p @ vals[g, first:past + i + 1] / p.sum()
            np.testing.assert_allclose(out[i, h * att.D:(h + 1) * att.D], expected, rtol=0, atol=2e-6)


def test_a_cache_not_bound_in_place_is_copied_then_written():
    att = Attention(in_place=False)
    q, k, v = rows(np.random.default_rng(3), 4)
    before = [a.copy() for a in att.cache]
    out = att(q, k, v, 20, np.arange(20, 24))
    ref, keys, _ = reference(att, before, q, k, v, 20, np.arange(20, 24))
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)
    np.testing.assert_allclose(att.cache[0][0, :, :24], keys, rtol=0, atol=1e-6)


@pytest.mark.parametrize("window", [0, 5])
def test_close_to_group_query_attention(window):
    """The same wiring as the stock op the exporter replaces, sliding window included: equal up to float rounding."""
    rng = np.random.default_rng(5)
    q, k, v = rows(rng, 6)
    bias = np.zeros((1, 1, 6, 46), np.float32)
    bias[0, 0, 3, 42] = MASKED  # a tree row that does not see an earlier node
    outs, caches = [], []
    for stock in (False, True):
        att = Attention(stock=stock, window=window)
        outs.append(att(q, k, v, 40, np.arange(40, 46), bias))
        caches.append(att.cache)
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(caches[0][0], caches[1][0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(caches[0][1], caches[1][1])


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("window", [0, 8, 101, 140])
@pytest.mark.parametrize("past,s,layout", [(50, 9, {}), (200, 9, LONG), (200, 16, LONG), (190, 30, LONG),
                                           (110, 30, LONG), (379, 9, SPLIT), (600, 2, SPLIT), (600, 4, SPLIT),
                                           (600, 12, SPLIT)])
def test_each_row_of_a_chain_equals_the_row_decoded_alone(window, past, s, layout, half):
    """Bitwise: a verify call over S tokens computes what S one-token steps compute. From 384 keys on a row's keys
    are attended in two halves (attention.h, kSplitKeys): the 379-token past puts the call's rows on both sides. A
    float16 cache likewise: each row's keys and values are rounded as they are written, before any row reads them."""
    rng = np.random.default_rng(7)
    q, k, v = rows(rng, s, layout.get("heads", (H, KV, D)))
    together = Attention(window=window, half=half, **layout)
    alone = Attention(window=window, half=half, **layout)
    out = together(q, k, v, past, np.arange(past, past + s))
    for i in range(s):
        row = alone(q[i:i + 1], k[i:i + 1], v[i:i + 1], past + i, [past + i])
        np.testing.assert_array_equal(out[i], row[0], err_msg=f"row {i}")
    np.testing.assert_array_equal(together.cache[0], alone.cache[0])
    np.testing.assert_array_equal(together.cache[1], alone.cache[1])


@pytest.mark.parametrize("heads", [(4, 1, 64), (8, 1, 96), (2, 2, 64), (8, 2, 128), (9, 3, 64), (4, 1, 256), (6, 2, 48)])
def test_head_layouts_match_the_reference_and_rows_their_one_token_steps(heads):
    """The CPU kernel attends up to three heads of a kv group per task (a group of 4 as 2 + 2, of 8 as 3 + 3 + 2) and
    head dims in blocks of 64 plus a tail of 8s (AVX2) or 16s (AVX-512; 256 is Gemma 3's): every layout against
    float64, and each row of a chain bitwise equal to the row decoded alone."""
    rng = np.random.default_rng(sum(heads))
    q, k, v = rows(rng, 5, heads)
    together, alone = Attention(heads=heads), Attention(heads=heads)
    before = [a.copy() for a in together.cache]
    out = together(q, k, v, 30, np.arange(30, 35))
    ref, _, _ = reference(together, before, q, k, v, 30, np.arange(30, 35))
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)
    for i in range(5):
        row = alone(q[i:i + 1], k[i:i + 1], v[i:i + 1], 30 + i, [30 + i])
        np.testing.assert_array_equal(out[i], row[0], err_msg=f"row {i}")


def head_norm(x: np.ndarray, weight: np.ndarray, head_dim: int) -> np.ndarray:
    """float64 RMSNorm of each head_dim slice (Gemma 3's q_norm / k_norm), back in float32."""
    heads = x.astype(np.float64).reshape(x.shape[0], -1, head_dim)
    inv = 1.0 / np.sqrt((heads ** 2).mean(-1, keepdims=True) + 1e-6)
    return (heads * inv * weight).reshape(x.shape).astype(np.float32)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("heads", [(6, 2, 32), (4, 1, 256)])
def test_q_and_k_norms_inside_the_op_equal_them_applied_before_it(packed, heads):
    """Inputs q_norm and k_norm (Gemma 3) normalise each head's query and key before the rotary embedding: the same
    outputs and cache as the op fed queries and keys normalised beforehand (to float rounding), and each row of a
    chain bitwise the row decoded alone."""
    rng = np.random.default_rng(5)
    h, kv, d = heads
    norms = (rng.uniform(0.5, 1.5, d).astype(np.float32), rng.uniform(0.5, 1.5, d).astype(np.float32))
    q, k, v = rows(rng, 6, heads)
    q, k = q * 3, k * 0.2  # far from unit RMS: a missing norm shows
    inside, before = Attention(packed=packed, heads=heads, norms=norms), Attention(packed=packed, heads=heads)
    out = inside(q, k, v, 20, np.arange(20, 26))
    expected = before(head_norm(q, norms[0], d), head_norm(k, norms[1], d), v, 20, np.arange(20, 26))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(inside.cache[0], before.cache[0], rtol=0, atol=1e-5)
    alone = Attention(packed=packed, heads=heads, norms=norms)
    for i in range(6):
        row = alone(q[i:i + 1], k[i:i + 1], v[i:i + 1], 20 + i, [20 + i])
        np.testing.assert_array_equal(out[i], row[0], err_msg=f"row {i}")
    np.testing.assert_array_equal(inside.cache[0], alone.cache[0])


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("window", [0, 20])
# 61: the tree's positions cross a 64-key block; 500: every node has 384 keys and more, so they are attended in two
# halves of their keys, counted from their positions as for the path decoded alone.
@pytest.mark.parametrize("past,layout", [(44, {}), (61, LONG), (125, LONG), (300, LONG), (500, SPLIT)])
def test_a_tree_row_equals_its_path_decoded_alone_after_compaction(window, past, layout, half):
    """Nodes of a draft tree attend to the past and their ancestors (the bias masks the rest, by index order); the
    accepted path, decoded one token at a time into a compacted cache, must give its rows bit for bit. A sliding
    window counts back from the node's position (its depth), not its row in the flattened tree."""
    parents = [-1, 0, 0, 1, 2, 4, 2]  # flattened: node 0 is the root
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    n = len(parents)
    bias = np.full((1, 1, n, past + n), MASKED, np.float32)
    bias[..., :past] = 0
    for i in range(n):
        j = i
        while j >= 0:
            bias[0, 0, i, past + j] = 0
            j = parents[j]
    rng = np.random.default_rng(11)
    q, k, v = rows(rng, n, layout.get("heads", (H, KV, D)))
    tree = Attention(window=window, half=half, **layout)
    start = [a.copy() for a in tree.cache]
    out = tree(q, k, v, past, past + np.array(depth), bias)
    path = [0, 2, 4, 5]
    alone = Attention(window=window, half=half, **layout)
    alone.cache = start
    for step, node in enumerate(path):
        row = alone(q[node:node + 1], k[node:node + 1], v[node:node + 1], past + step, [past + step])
        np.testing.assert_array_equal(out[node], row[0], err_msg=f"node {node}")
    compacted = tree.cache[0][:, :, [*range(past), *(past + np.array(path))]]
    np.testing.assert_array_equal(compacted, alone.cache[0][:, :, :past + len(path)])


def test_unsupported_attributes_and_bad_inputs_are_clear_errors():
    ensure_library()
    model = attention_model(H, KV, D)
    model.graph.node[0].attribute.append(__import__("onnx").helper.make_attribute("softcap", 30.0))
    so = ort.SessionOptions()
    ek.register(so)
    with pytest.raises(Exception, match="softcap"):
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    att = Attention()
    q, k, v = rows(np.random.default_rng(0), 2)
    with pytest.raises(Exception, match="total_sequence_length 97 must be in"):
        att(q, k, v, 95, [95, 96])
    if DEVICE == "cpu":  # device positions are clamped instead (the kernel never reads outside the cache)
        with pytest.raises(Exception, match="outside the rotary cache"):
            att(q, k, v, 10, [10, 400])


@pytest.mark.skipif("EDGE_KERNELS_ISA" in os.environ or DEVICE != "cpu", reason="a kernel was chosen, or on CUDA")
def test_the_portable_kernel_passes_the_same_tests():
    """The kernel choice is made once per process: run this file again on the portable kernel."""
    run_test_file(__file__, EDGE_KERNELS_ISA="portable")


@pytest.mark.skipif("EDGE_KERNELS_ISA" in os.environ or DEVICE != "cpu", reason="a kernel was chosen, or on CUDA")
def test_the_avx2_kernel_passes_the_same_tests():
    """Where the AVX-512 kernel runs by default, the AVX2 one still serves CPUs without it (or the best this CPU
    has, where it has no AVX2)."""
    run_test_file(__file__, EDGE_KERNELS_ISA="avx2")


@pytest.mark.skipif(DEVICE != "cpu" or not cuda_available(), reason="needs onnxruntime-gpu, a GPU and the CUDA build")
def test_the_cuda_kernel_passes_the_same_tests():
    run_test_file(__file__, EDGE_TEST_DEVICE="cuda")
