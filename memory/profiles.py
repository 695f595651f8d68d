"""Device profiles: what a class of device offers a model, read from the TOML files in `edge.profiles`.

A profile is data, not code, so a user can add one for their own machine (pass a path to a .toml file) and every
number carries its source next to it in the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from edge.errors import EdgeError
from edge.memory.budget import GiB, MiB

KINDS = ("cpu", "cuda")
_REQUIRED = ("kind", "memory_gib", "memory_bandwidth_gb_s", "disk_read_gb_s", "compute_capability")


class ProfileError(EdgeError):
    """A device profile is unknown or malformed."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: str  # "cpu" or "cuda"
    memory_bytes: int  # memory the model's weights, caches and runtime may use (the budget)
    memory_bandwidth: float  # bytes/s
    disk_read_bandwidth: float  # bytes/s, sequential
    compute_capability: str  # CUDA compute capability ("8.9"), or the CPU's vector ISA ("avx2")
    description: str = ""
    runtime_overhead_bytes: int | None = None  # None: the measured CPU runtime overhead of edge.memory.budget
    # The least time a decode step spends per layer whatever the bytes (launches and onnxruntime's dispatch of the
    # layer's nodes): on a GPU it, not bandwidth, sets a small model's step. 0: bandwidth alone.
    layer_dispatch_seconds: float = 0.0


def _profile_files() -> dict[str, Any]:
    """{name: resource} for every bundled profile."""
    return {p.name.removesuffix(".toml"): p for p in resources.files("edge.profiles").iterdir()
            if p.name.endswith(".toml")}


def profile_names() -> list[str]:
    return sorted(_profile_files())


def parse_profile(data: dict[str, Any], name: str) -> DeviceProfile:
    """A profile from a parsed TOML table, with the reason when a field is missing or wrong."""
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ProfileError(f"device profile {name!r} lacks {', '.join(missing)}")
    if data["kind"] not in KINDS:
        raise ProfileError(f"device profile {name!r} has kind {data['kind']!r}; use one of {', '.join(KINDS)}")
    numbers = ("memory_gib", "memory_bandwidth_gb_s", "disk_read_gb_s")
    for key in numbers:
        if not isinstance(data[key], (int, float)) or isinstance(data[key], bool) or data[key] <= 0:
            raise ProfileError(f"device profile {name!r}: {key} must be a positive number, got {data[key]!r}")
    overhead = data.get("runtime_overhead_mib")
    dispatch = data.get("layer_dispatch_us", 0.0)
    if not isinstance(dispatch, (int, float)) or isinstance(dispatch, bool) or dispatch < 0:
        raise ProfileError(f"device profile {name!r}: layer_dispatch_us must be a number >= 0, got {dispatch!r}")
    return DeviceProfile(
        name=name,
        kind=data["kind"],
        memory_bytes=int(data["memory_gib"] * GiB),
        memory_bandwidth=float(data["memory_bandwidth_gb_s"]) * 1e9,
        disk_read_bandwidth=float(data["disk_read_gb_s"]) * 1e9,
        compute_capability=str(data["compute_capability"]),
        description=str(data.get("description", "")),
        runtime_overhead_bytes=None if overhead is None else int(overhead * MiB),
        layer_dispatch_seconds=float(dispatch) * 1e-6,
    )


def load_profile(name: str) -> DeviceProfile:
    """A bundled profile by name, or a profile file by path (anything ending in .toml)."""
    if name.endswith(".toml"):
        path = Path(name)
        if not path.is_file():
            raise ProfileError(f"device profile file {name} does not exist")
        text, name = path.read_text(), path.stem
    else:
        files = _profile_files()
        if name not in files:
            raise ProfileError(f"unknown device profile {name!r}; known profiles: {', '.join(sorted(files))} "
                               "(or pass a path to a .toml profile)")
        text = files[name].read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"device profile {name!r} is not valid TOML: {exc}") from exc
    return parse_profile(data, name)
