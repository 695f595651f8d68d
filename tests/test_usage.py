import subprocess
import sys

import numpy as np

from edge.memory.usage import peak_rss_bytes, rss_bytes


def test_peak_is_at_least_current_and_sees_a_large_allocation():
    before = peak_rss_bytes()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    assert peak_rss_bytes() >= max(before, rss_bytes()) and peak_rss_bytes() >= block.nbytes


def test_child_of_a_large_parent_reports_its_own_peak():
    """A benchmark driver holding a big model must not inflate its workers' numbers (ru_maxrss would)."""
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB in the parent
    code = "from edge.memory.usage import peak_rss_bytes; print(peak_rss_bytes())"
    child_peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child_peak < 200 * 2**20 < ballast.nbytes
