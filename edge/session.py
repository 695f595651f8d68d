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


def create_session(graph: Path, device: str = "cpu", threads: int | None = None,
                   custom_ops: list[str] | None = None, spin: bool | None = None) -> ort.InferenceSession:
    """custom_ops: the custom-op domains the graph uses (the manifest's graph.custom_ops); "edge" is ours.
    spin: whether idle worker threads spin; None: spin_setting(). A session that runs beside another on the same
    cores (a draft model's) passes False: its spinning threads take the cores the other session's run needs."""
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
    options.intra_op_num_threads = threads or default_threads()
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
    providers = [provider] if device == "cpu" else [provider, "CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(graph), sess_options=options, providers=providers)
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
