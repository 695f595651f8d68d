"""Session creation: the spinning settings reach onnxruntime as asked."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edge.session
from edge.session import create_session, spin_setting


@pytest.mark.parametrize("value, want", [(None, edge.session.DEFAULT_SPIN), ("1", "1"), ("0", "0"), ("run", "run"),
                                         ("yes", "0")])
def test_spin_setting_reads_edge_spin(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("EDGE_SPIN", raising=False)
    else:
        monkeypatch.setenv("EDGE_SPIN", value)
    assert spin_setting() == want


def _relu_model(path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
                     .SerializeToString())


def _entry(options, key: str) -> str:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # never set
        return ""


@pytest.mark.parametrize("env, spin, allow, stop", [("run", None, "1", "1"), ("1", None, "1", ""),
                                                    ("0", None, "0", ""), ("run", False, "0", "")])
def test_run_spins_within_a_run_only(tmp_path, monkeypatch, env, spin, allow, stop):
    """EDGE_SPIN=run: workers spin between ops and stop when the run ends; an explicit spin=False wins."""
    seen = []
    real = ort.InferenceSession

    def capture(path, sess_options=None, **kwargs):
        seen.append(sess_options)
        return real(path, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(edge.session.ort, "InferenceSession", capture)
    monkeypatch.setenv("EDGE_SPIN", env)
    _relu_model(tmp_path / "m.onnx")
    session = create_session(tmp_path / "m.onnx", "cpu", 2, spin=spin)
    options = seen[-1]
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == allow
    assert _entry(options, "session.force_spinning_stop") == stop
    np.testing.assert_array_equal(session.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])


def test_a_graph_newer_than_the_kernel_library_says_to_rebuild_it(tmp_path):
    """A node of edge's domain that this library's op schema refuses (here: more inputs than it takes, as a graph
    exported by a newer edge meets an old build) is a KernelLibraryError that says what to rebuild."""
    from kernels_util import ensure_library

    from edge.kernels import KernelLibraryError

    ensure_library()
    node = helper.make_node("QMatMul", ["x"] + [f"w{i}" for i in range(18)], ["y"], domain="edge", K=16, N=8,
                            bits=4, group_size=16)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16]) for n in node.input]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("edge", 1)]
    (tmp_path / "m.onnx").write_bytes(helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString())
    with pytest.raises(KernelLibraryError, match="Rebuild the library"):
        create_session(tmp_path / "m.onnx", "cpu", 1, ["edge"])
