"""The phase recorder puts memory where it was allocated."""

from __future__ import annotations

import time

import numpy as np

from edge.memory.phases import PhaseRecorder, nvml_reader


def test_a_transient_allocation_is_counted_in_its_own_phase():
    recorder = PhaseRecorder(interval=0.002).start()
    with recorder.phase("quiet"):
        time.sleep(0.02)
    with recorder.phase("spike"):
        block = np.ones(64 << 20, np.uint8)  # 64 MiB, written so it is resident; alive at the phase's last sample
        time.sleep(0.02)
    del block
    with recorder.phase("after"):
        time.sleep(0.02)
    recorder.stop()
    quiet, spike, after = recorder.phases
    assert spike.peak - quiet.peak > 48 << 20
    assert after.peak < spike.peak - (48 << 20)
    assert quiet.start <= quiet.end <= spike.start <= spike.end <= after.start
    times = [s.seconds for s in recorder.samples]
    assert times == sorted(times) and len(times) > 10


def test_nvml_is_optional():
    reader = nvml_reader()
    assert reader is None or reader() >= 0
