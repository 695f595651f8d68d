"""ONNX Runtime sessions on the device the user asked for, and nothing else.

onnxruntime-gpu silently falls back to the CPU when CUDA cannot load; a user who asked for the GPU must be told, so
the providers a session really got are checked after creation.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnxruntime as ort
import psutil

from edge.errors import DeviceError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEFAULT_SPIN = "1"
# Microseconds an idle team thread spins before it sleeps, by spin setting: "1" long enough to bridge the Python
# between two decode steps or a draft and its verify call (0.1-2 ms), "run" the gaps between the ops of one run.
TEAM_SPIN_US = {"1": 5000, "run": 100, "0": 0}


def default_threads() -> int:
    """Physical cores: hyper-threads only add contention to memory-bound decoding."""
    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def spin_setting() -> str:
    """Whether idle worker threads spin between ops. Spinning saves a wake-up per op on an idle machine, but on a
    busy one a spinning thread burns the core that another thread needs (measured: 2x slower decoding with 2
    threads on 2 busy cores). EDGE_SPIN=1 or 0 overrides the default; benchmarks/decode.py measures both.
    EDGE_SPIN=run: spin between the ops of a run, stop when it ends, for sessions that take turns on the same cores
    (two target sessions side by side, as benchmarks/step_ab.py --paired runs them: with both spinning a 1-token
    step took 9.3 ms instead of 5.5)."""
    value = os.environ.get("EDGE_SPIN", DEFAULT_SPIN)
    return value if value in ("1", "run") else "0"


def _start_team(library: Path, threads: int) -> bool:
    """Let edge's CPU ops split their work over the kernel library's own threads (kernels/cpu/team.h) instead of
    onnxruntime's: a hand-over costs ~0.4 us against onnxruntime's ~1-1.5 us, over ~150 split calls a step, and
    each thread runs a contiguous share of a call's chunks. One team serves every session of the process (a draft
    model's or draft head's too), so two sessions' idle threads never spin against each other; `threads` asks for
    at least that many in all. EDGE_TEAM=0 keeps onnxruntime's threads. Idle team threads spin for TEAM_SPIN_US
    of the spin setting (EDGE_SPIN), then sleep. False when the library predates the team."""
    if os.environ.get("EDGE_TEAM", "1") == "0":
        return False
    from edge.kernels.library import start_team

    return start_team(library, threads, TEAM_SPIN_US[spin_setting()]) is not None


def check_cuda_graph(graph: Path) -> None:
    """Refuse a graph with float32 GroupQueryAttention on CUDA. onnxruntime has no CUDA kernel for it, so it places
    those nodes on the CPU, and with the KV cache bound in place in device memory the output is wrong (measured on
    an H100: greedy tokens differ from the CPU's from the second token on, at half the speed)."""
    model = onnx.load(str(graph), load_external_data=False)
    if any(n.op_type == "GroupQueryAttention" for n in model.graph.node) and any(
            i.name.startswith("past_key") and i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
            for i in model.graph.input):
        raise DeviceError(f"{graph} uses onnxruntime's GroupQueryAttention in float32, which has no CUDA kernel; "
                          f"export the model with edge's kernels for the GPU (edge-export --quant int4 --kernels edge), "
                          f"or use --device cpu")


def kv_retyped(graph: Path, dtype: str) -> bytes | None:
    """The graph with its past and present caches declared in `dtype`, serialised; None when they already are.

    Only the graph's inputs and outputs change: edge.Attention reads and writes them directly and is registered for
    both cache types (Package.with_kv_dtype). The weights stay in the package's external data, which the session
    reads from the graph's folder (session.model_external_initializers_file_folder_path), as from the file itself."""
    from edge.kernels.graph import KV_TYPES

    model = onnx.load(str(graph), load_external_data=False)
    caches = [v for v in list(model.graph.input) + list(model.graph.output) if v.name.startswith(("past_", "present_"))]
    if all(v.type.tensor_type.elem_type == KV_TYPES[dtype] for v in caches):
        return None
    if any(n.op_type == "GroupQueryAttention" for n in model.graph.node):
        raise DeviceError(f"{graph} attends with onnxruntime's GroupQueryAttention, which keeps its cache in the "
                          f"query's type; a {dtype} KV cache needs edge.Attention (export with --kernels edge)")
    for v in caches:
        v.type.tensor_type.elem_type = KV_TYPES[dtype]
    return model.SerializeToString()


def without_row_tops(model: str | bytes) -> bytes | None:
    """The graph without the head's output of row tops (kernels/graph.py: with_top), serialised; None when it has
    none. Only the CPU kernel computes them: edge.QMatMul refuses the attribute on CUDA."""
    from edge.kernels.graph import without_top

    proto = onnx.load(model, load_external_data=False) if isinstance(model, str) else onnx.load_from_string(model)
    return proto.SerializeToString() if without_top(proto) else None


def create_session(graph: Path, device: str = "cpu", threads: int | None = None,
                   custom_ops: list[str] | None = None, spin: bool | None = None,
                   kv_dtype: str | None = None) -> ort.InferenceSession:
    """custom_ops: the custom-op domains the graph uses (the manifest's graph.custom_ops); "edge" is ours.
    spin: whether idle worker threads spin; None: spin_setting(). A session that runs beside another on the same
    cores (a draft model's) passes False: its spinning threads take the cores the other session's run needs.
    kv_dtype: the KV cache type to run with (kv_retyped), None: the graph's own."""
    if device not in PROVIDERS:
        raise DeviceError(f"unknown device {device!r}; choose one of {', '.join(PROVIDERS)}")
    provider = PROVIDERS[device]
    if provider not in ort.get_available_providers():
        raise DeviceError(f"device {device!r} was asked for, but this onnxruntime has no {provider} "
                          f"(available: {', '.join(ort.get_available_providers())}). "
                          f"Install onnxruntime-gpu (and not onnxruntime) on a machine with CUDA 13, or use --device cpu.")
    if device == "cuda":
        check_cuda_graph(graph)
    options = ort.SessionOptions()
    threads = threads or default_threads()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    setting = spin_setting() if spin is None else str(int(spin))
    options.add_session_config_entry("session.intra_op.allow_spinning", "0" if setting == "0" else "1")
    if setting == "run":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    library = None
    for domain in custom_ops or []:
        if domain != "edge":
            raise DeviceError(f"the model needs custom ops of domain {domain!r}, which edge does not provide")
        from edge.kernels import register

        library = register(options, cuda=device == "cuda")
        if device == "cpu" and _start_team(library, threads):
            options.intra_op_num_threads = 1  # edge's ops split over the team; onnxruntime's few others need none
    providers = [provider] if device == "cpu" else [provider, "CPUExecutionProvider"]
    model: str | bytes = str(graph)
    retyped = kv_retyped(graph, kv_dtype) if kv_dtype is not None else None
    if retyped is not None:
        model = retyped
    if device != "cpu":
        model = without_row_tops(model) or model
    if model != str(graph):
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime's own exception types
        if library is None or "edge::" not in str(exc):
            raise
        from edge.kernels import KernelLibraryError

        raise KernelLibraryError(
            f"{graph} uses edge's ops in a form the kernel library {library} does not know (an older build than the "
            f"edge that exported it: {exc}). Rebuild the library (`pip install -e .`, or `python -m edge.kernels.build`"
            f"), or re-export the model with this edge.") from exc
    if session.get_providers()[0] != provider:
        raise DeviceError(f"onnxruntime could not start {provider} (it fell back to {session.get_providers()}); "
                          f"check the CUDA 13 driver and libraries, or use --device cpu")
    return session
