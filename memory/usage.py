"""Measured memory of this process.

Peak RSS comes from the kernel's high-water mark (VmHWM), which starts fresh when a process execs. getrusage's
ru_maxrss does not: a child forked from a large parent (a benchmark driver that just exported a model) would report
the parent's peak.
"""

from __future__ import annotations

import resource
import sys

import psutil


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
