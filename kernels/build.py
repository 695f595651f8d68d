"""Compile edge's custom-op libraries with the system toolchain (g++, and nvcc where present).

Why not setuptools' Extension machinery: these are plain shared libraries that ONNX Runtime dlopens (no Python
module init), one translation unit needs -mavx2 -mfma and the others must not, and the CUDA one needs nvcc. setup.py
calls build_all() from its build_ext step; tests call build_cpu() when no library was built yet.

Run as a script to build in place: python kernels/build.py [--no-cuda]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
CPU_DIR = HERE / "cpu"
CUDA_DIR = HERE / "cuda"
CPU_LIBRARY = "libedge_kernels.so"
CUDA_LIBRARY = "libedge_kernels_cuda.so"

COMMON_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-Wall", "-Wextra",
                "-Wno-unused-parameter"]
# Only the translation unit named *_<isa>.cc gets that ISA's flags; the library picks one at run time.
ISA_FLAGS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "avx512": ["-mavx512f", "-mavx2", "-mfma", "-mf16c"],
             "avx512vnni": ["-mavx512f", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"],
             "avxvnni": ["-mavxvnni", "-mavx2", "-mfma", "-mf16c"]}
# Consumer cards from Turing on; sm_90 also covers the H100/H200 test bench; PTX keeps newer GPUs working.
CUDA_ARCHS = ["75", "80", "86", "89", "90"]


class BuildError(RuntimeError):
    """A compiler was found but failed; the message carries its output."""


def find_compiler() -> str | None:
    """The C++ compiler to use: $CXX, else g++, else c++."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME, PATH, or /usr/local/cuda; None when CUDA is not installed."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def _run(cmd: list[str], log: Callable[[str], None]) -> None:
    log(" ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _compile_all(jobs: list[tuple[list[str], Path]], log: Callable[[str], None]) -> list[Path]:
    """Run compiler commands in parallel (one per CPU); returns the object files in order."""
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for future in [pool.submit(_run, cmd, log) for cmd, _obj in jobs]:
            future.result()
    return [obj for _cmd, obj in jobs]


def _cpu_jobs(cxx: str, tmp: Path, defines: list[str]) -> list[tuple[list[str], Path]]:
    jobs = []
    for source in sorted(CPU_DIR.glob("*.cc")):
        obj = tmp / (source.stem + ".o")
        extra = ISA_FLAGS.get(source.stem.rsplit("_", 1)[-1], [])
        jobs.append(([cxx, *COMMON_FLAGS, *extra, *defines, "-I", str(CPU_DIR), "-c", str(source), "-o", str(obj)],
                     obj))
    return jobs


def _install(built: Path, target: Path) -> Path:
    """Move a finished library into place atomically (never leave a half-written .so where ORT would load it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".tmp")
    shutil.copyfile(built, staging)
    os.replace(staging, target)
    return target


def build_cpu(out_dir: Path = HERE, log: Callable[[str], None] = print) -> Path:
    """Build the CPU library into out_dir; raises BuildError when no compiler is found or compilation fails."""
    cxx = find_compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (install g++, e.g. `apt-get install g++`, or set $CXX)")
    with tempfile.TemporaryDirectory(prefix="edge-kernels-") as tmp_name:
        tmp = Path(tmp_name)
        objects = _compile_all(_cpu_jobs(cxx, tmp, []), log)
        lib = tmp / CPU_LIBRARY
        # -pthread -ldl: the team's threads and dladdr (in libc itself from glibc 2.34; separate libraries before)
        _run([cxx, "-shared", "-Wl,--no-undefined", "-o", str(lib), *map(str, objects), "-pthread", "-ldl"], log)
        return _install(lib, Path(out_dir) / CPU_LIBRARY)


def build_cuda(out_dir: Path = HERE, log: Callable[[str], None] = print, archs: list[str] | None = None) -> Path:
    """Build the CUDA library (CPU and CUDA registrations of edge.QMatMul, linked to libcudart.so.13).

    archs: SM versions to compile for (default CUDA_ARCHS; PTX of the newest is embedded for later GPUs).
    """
    cxx, nvcc = find_compiler(), find_nvcc()
    if cxx is None or nvcc is None:
        raise BuildError("the CUDA library needs both g++ and nvcc (CUDA toolkit 12.x/13.x)")
    archs = archs or CUDA_ARCHS
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    with tempfile.TemporaryDirectory(prefix="edge-kernels-cuda-") as tmp_name:
        tmp = Path(tmp_name)
        defines = ["-DEDGE_WITH_CUDA"]
        jobs = _cpu_jobs(cxx, tmp, defines)
        for source in sorted(CUDA_DIR.glob("*.cc")):
            obj = tmp / (source.stem + ".o")
            jobs.append(([cxx, *COMMON_FLAGS, *defines, "-I", str(CPU_DIR), "-I", str(CUDA_DIR), "-c", str(source),
                          "-o", str(obj)], obj))
        for source in sorted(CUDA_DIR.glob("*.cu")):
            obj = tmp / (source.stem + ".cu.o")
            jobs.append(([nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden", "--fmad=false",
                          *gencode, "-I", str(CPU_DIR), "-I", str(CUDA_DIR), "-c", str(source), "-o", str(obj)], obj))
        objects = _compile_all(jobs, log)
        lib = tmp / CUDA_LIBRARY
        # nvcc links with the host compiler and knows where its own libcudart lives.
        _run([nvcc, "-shared", "-cudart", "shared", "-Xlinker", "--no-undefined", "-o", str(lib),
              *map(str, objects), "-lpthread", "-ldl"], log)
        return _install(lib, Path(out_dir) / CUDA_LIBRARY)


def build_all(out_dir: Path = HERE, log: Callable[[str], None] = print, cuda: bool = True) -> list[str]:
    """Build what the toolchain allows; never raises. Returns human-readable notes on what was skipped or failed."""
    notes = []
    try:
        build_cpu(out_dir, log)
    except BuildError as exc:
        notes.append(f"edge kernels: CPU library not built, the stock-op fallback will be used: {exc}")
    if cuda and find_nvcc() is not None:
        try:
            build_cuda(out_dir, log)
        except BuildError as exc:
            notes.append(f"edge kernels: CUDA library not built: {exc}")
    elif cuda:
        notes.append("edge kernels: nvcc not found, CUDA library not built (CPU library only)")
    return notes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for note in build_all(HERE, cuda="--no-cuda" not in args):
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
