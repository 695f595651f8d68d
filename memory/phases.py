"""Memory of this process over time, split into named phases (imports, session creation, prefill, decode).

A background thread samples RSS (and GPU memory through NVML when pynvml and a GPU are there) every few
milliseconds; a phase's peak is the larger of its samples and the kernel's high-water mark when that mark rose during
the phase, so a spike shorter than the sampling interval is still counted, in the phase where it happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from edge.memory.usage import peak_rss_bytes, rss_bytes


@dataclass
class Sample:
    seconds: float  # since the recorder started
    rss: int
    gpu: int | None = None


@dataclass
class Phase:
    name: str
    start: float
    end: float = 0.0
    rss_before: int = 0
    rss_after: int = 0
    peak: int = 0  # process RSS at its highest during the phase
    gpu_peak: int | None = None


def nvml_reader() -> Callable[[], int] | None:
    """Bytes used on GPU 0, or None when pynvml or a GPU is missing (the profile then reports CPU memory only)."""
    try:
        import pynvml  # optional: not a dependency of edge

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:
        return None
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


@dataclass
class PhaseRecorder:
    interval: float = 0.005
    gpu: Callable[[], int] | None = None
    samples: list[Sample] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def sample(self) -> Sample:
        with self._lock:  # timestamp and append together: samples from both threads stay in time order
            s = Sample(self.now(), rss_bytes(), self.gpu() if self.gpu else None)
            self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "PhaseRecorder":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="edge-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    @contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        hwm_before = peak_rss_bytes()
        first = self.sample()
        current = Phase(name, start=first.seconds, rss_before=first.rss)
        self.phases.append(current)
        try:
            yield current
        finally:
            last = self.sample()
            current.end, current.rss_after = last.seconds, last.rss
            with self._lock:
                inside = [s for s in self.samples if current.start <= s.seconds <= current.end]
            current.peak = max(s.rss for s in inside)
            hwm_after = peak_rss_bytes()
            if hwm_after > hwm_before:  # the process reached a new high during this phase
                current.peak = max(current.peak, hwm_after)
            gpus = [s.gpu for s in inside if s.gpu is not None]
            current.gpu_peak = max(gpus) if gpus else None
