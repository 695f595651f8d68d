"""The kernel library's own threads (kernels/cpu/team.h): the ops give the same bits on the team as on
onnxruntime's threads, every chunk runs once, and the team survives a fork, two callers at once and workers that
sleep between jobs.

The team is process-wide: once started here, later tests in this process run their ops on it too (as every
process that creates an edge session does). The comparisons use a copy of the library at another path, which
dlopen loads as a library of its own, with its team off.
"""

from __future__ import annotations

import multiprocessing
import shutil
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import edge.kernels as ek
from edge.kernels.library import ENV_LIBRARY, start_team, team_stats
from kernels_util import QMatMulRunner, assert_close_to_reference, ensure_library, make_weight
from test_kernels_attention import LONG, Attention, rows
from test_kernels_norm import NormRunner, case

SPIN_US = 5000


@pytest.fixture(scope="module")
def team() -> Path:
    """The library, its team started for two threads."""
    ensure_library()
    path = ek.library_path()
    assert start_team(path, 2, SPIN_US) == 2
    return path


@pytest.fixture
def without_team(tmp_path, monkeypatch):
    """Call it, and sessions registered after load a copy of the library whose team was never started."""
    copy = tmp_path / "libedge_kernels_copy.so"
    shutil.copy(ek.library_path(), copy)
    return lambda: monkeypatch.setenv(ENV_LIBRARY, str(copy))


def _qmatmul(accuracy_level: int, threads: int = 1) -> tuple[QMatMulRunner, np.ndarray]:
    rng = np.random.default_rng(7)
    packed, w = make_weight(rng, 1536, 576, 4, 32)
    return QMatMulRunner(packed, threads=threads, accuracy_level=accuracy_level), w


def _jobs(team: Path) -> int:
    return team_stats(team)["jobs"]


def test_a_running_team_never_shrinks(team):
    assert start_team(team, 1, SPIN_US) == 2
    assert team_stats(team)["threads"] == 2


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_qmatmul_on_the_team_equals_onnxruntime_threads_bitwise(team, without_team, accuracy_level):
    """Every row of M = 1..64, each call split into up to 8 chunks over the team; the same split over onnxruntime's
    threads in a library without a team gives the same bits, and the team really ran the calls."""
    on_team, w = _qmatmul(accuracy_level)
    x = np.random.default_rng(3).standard_normal((64, 576)).astype(np.float32)
    before = _jobs(team)
    ours = {m: on_team(x[:m]) for m in (1, 2, 8, 9, 64)}
    assert _jobs(team) - before >= 4  # the 1-row call is the only one too small to split
    without_team()
    on_ort, _ = _qmatmul(accuracy_level, threads=2)
    for m, y in ours.items():
        np.testing.assert_array_equal(y, on_ort(x[:m]))
        np.testing.assert_array_equal(y, ours[64][:m])  # batch invariance holds on the team too
    if accuracy_level == 0:
        assert_close_to_reference(ours[64], x, w, None)


@pytest.mark.parametrize("s, past", [(1, 200), (9, 150), (16, 40)])
def test_attention_on_the_team_equals_onnxruntime_threads_bitwise(team, without_team, s, past):
    att_team = Attention(threads=1, **LONG)
    without_team()
    att_ort = Attention(threads=2, **LONG)
    q, k, v = rows(np.random.default_rng(s), s, LONG["heads"])
    positions = list(range(past, past + s))
    before = _jobs(team)
    ours = att_team(q, k, v, past, positions)
    assert _jobs(team) > before
    np.testing.assert_array_equal(ours, att_ort(q, k, v, past, positions))
    np.testing.assert_array_equal(att_team.cache[0], att_ort.cache[0])


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_the_norm_and_digits_split_by_rows_give_the_same_bits(team, without_team, accuracy_level):
    """Calls of several rows normalise their rows and round them to digits on the team's threads (for_rows in
    register.cc), each thread into the caller's buffers: the output and the residual sum are those of onnxruntime's
    threads, which do both on one thread."""
    packed, _, gamma, x, skip = case(np.random.default_rng(accuracy_level), k=576, n=256)  # 21 rows: split
    on_team = NormRunner(packed, gamma, skip=True, accuracy_level=accuracy_level)
    before = _jobs(team)
    ours = on_team(x, skip)
    assert _jobs(team) - before >= 3  # norm, digits (accuracy level 4) or prescale, tiles
    without_team()
    theirs = NormRunner(packed, gamma, skip=True, accuracy_level=accuracy_level)(x, skip)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def _run_in_child(queue, library: Path) -> None:
    runner, _ = _qmatmul(4)
    x = np.random.default_rng(3).standard_normal((16, 576)).astype(np.float32)
    queue.put((runner(x), team_stats(library)))


def test_a_forked_child_runs_without_the_team_and_gets_the_same_bits(team):
    runner, _ = _qmatmul(4)
    x = np.random.default_rng(3).standard_normal((16, 576)).astype(np.float32)
    want = runner(x)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_run_in_child, args=(queue, team))
    child.start()
    y, stats = queue.get(timeout=60)  # a child waiting on its parent's workers would never answer
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(y, want)
    assert stats == {"threads": 1, "jobs": 0}


def test_two_callers_at_once_both_get_their_results(team):
    """A second thread's call finds the team busy and runs on onnxruntime's threads (one: serially)."""
    runner, _ = _qmatmul(4)
    xs = [np.random.default_rng(i).standard_normal((8, 576)).astype(np.float32) for i in range(2)]
    wants = [runner(x) for x in xs]
    errors: list[str] = []

    def call(i: int) -> None:
        for _ in range(50):
            if not np.array_equal(runner(xs[i]), wants[i]):
                errors.append(f"caller {i}: wrong result")

    callers = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=120)
    assert not errors and not any(c.is_alive() for c in callers)


def test_workers_asleep_between_jobs_are_woken(team):
    runner, _ = _qmatmul(4)
    x = np.random.default_rng(5).standard_normal((8, 576)).astype(np.float32)
    want = runner(x)
    start_team(team, 2, 0)  # workers sleep as soon as a job ends
    try:
        before = _jobs(team)
        for _ in range(100):
            np.testing.assert_array_equal(runner(x), want)
        assert _jobs(team) - before >= 100  # every call split (its prologue too: 8 rows)
    finally:
        start_team(team, 2, SPIN_US)


def test_sessions_run_at_one_onnxruntime_thread_on_the_team(team, monkeypatch, tmp_path):
    """create_session: an edge graph on the CPU gets one onnxruntime thread and the team; EDGE_TEAM=0 keeps
    onnxruntime's threads."""
    pytest.importorskip("psutil")  # edge.session's; the ABI matrix (.ci/abi-matrix) runs this file without it
    import edge.session
    from edge.kernels.graph import qmatmul_model

    packed, _ = make_weight(np.random.default_rng(1), 64, 64, 4, 32)
    path = tmp_path / "m.onnx"
    path.write_bytes(qmatmul_model(packed, ["M", 64])[0].SerializeToString())
    seen = []
    real = ort.InferenceSession

    def capture(graph, sess_options=None, **kwargs):
        seen.append(sess_options.intra_op_num_threads)
        return real(graph, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(edge.session.ort, "InferenceSession", capture)
    edge.session.create_session(path, "cpu", 2, ["edge"])
    monkeypatch.setenv("EDGE_TEAM", "0")
    edge.session.create_session(path, "cpu", 2, ["edge"])
    assert seen == [1, 2]
