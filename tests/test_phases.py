"""The phase recorder puts memory where it was allocated."""

from __future__ import annotations

import json
import subprocess
import sys

from edge.memory.phases import nvml_reader


SCENARIO = """
import json, time
import numpy as np
from edge.memory.phases import PhaseRecorder
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
print(json.dumps({"phases": [[p.start, p.end, p.peak] for p in recorder.phases],
                  "times": [s.seconds for s in recorder.samples]}))
"""


def test_a_transient_allocation_is_counted_in_its_own_phase():
    """In a fresh process: a long test session's allocator reuses resident pages, which would hide the spike."""
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    (q_start, q_end, quiet), (s_start, s_end, spike), (a_start, _, after) = result["phases"]
    assert spike - quiet > 48 << 20
    assert after < spike - (48 << 20)
    assert q_start <= q_end <= s_start <= s_end <= a_start
    times = result["times"]
    assert times == sorted(times) and len(times) > 10


def test_nvml_is_optional():
    reader = nvml_reader()
    assert reader is None or reader() >= 0
