"""edge-export and edge-run as a user calls them: output on success, one clear line and exit code 2 on bad input."""

from __future__ import annotations

import pytest

from edge.apps import export as export_cli
from edge.apps import run as run_cli
from edge.export.pipeline import export_model
from tiny_models import tiny_llama


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    model, imported = tiny_llama(seed=9, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(imported.tokenizer_json)
    return folder


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    _, imported = tiny_llama(seed=9, initializer_range=0.3)
    return export_model("tiny", tmp_path_factory.mktemp("pkg") / "tiny", quant="fp32", model=imported)


def test_export_a_hugging_face_folder(hf_folder, tmp_path, capsys):
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "out"), "--quant", "int4"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "out" / "manifest.json").exists()
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "out")]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    # a float16 KV cache needs edge.Attention, and resident layers
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "h"), "--kv-dtype", "float16"]) == 2
    assert "needs --kernels edge" in capsys.readouterr().err
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "h"), "--quant", "fp32", "--paged",
                            "--kv-dtype", "float16"]) == 2
    assert "--paged" in capsys.readouterr().err and not (tmp_path / "h").exists()


def test_export_of_a_foreign_file_fails_cleanly(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a model")
    assert export_cli.main([str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge-export: error:") and "notes.txt" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_run_streams_text_and_stats(package, capsys):
    assert run_cli.main([str(package / "model.onnx"), "t1 t2 t3", "--raw", "-n", "6", "--stats", "--context", "64"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 6 and all(w.startswith("t") for w in out.split())
    assert "generated 6 tokens" in err and "peak RSS" in err


def test_run_reports_bad_input_without_traceback(package, capsys):
    long_prompt = " ".join(["t5"] * 80)
    assert run_cli.main([str(package), long_prompt, "--raw", "--context", "64"]) == 2
    assert "context holds 64" in capsys.readouterr().err
    assert run_cli.main([str(package), "t1", "--raw", "--device", "cuda"]) == 2
    assert "CUDAExecutionProvider" in capsys.readouterr().err
    assert run_cli.main(["/no/such/model.onnx", "hi"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert run_cli.main([str(package), "", "--raw", "--context", "64"]) == 2
    assert "the prompt is empty" in capsys.readouterr().err
    # a half KV cache needs edge.Attention: this package attends with onnxruntime's GroupQueryAttention
    assert run_cli.main([str(package), "t1", "--raw", "--kv-dtype", "float16"]) == 2
    assert "--kernels edge" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1"], "--temperature: must be at least 0, got -1"),
    (["--top-p", "0"], "--top-p: must be in (0, 1], got 0"),
    (["--top-p", "nan"], "--top-p: must be in (0, 1], got nan"),
    (["-n", "0"], "--max-tokens: must be at least 1, got 0"),
    (["--threads", "two"], "--threads: expected an integer, got 'two'"),
    (["--context", "-5"], "--context: must be at least 1, got -5"),
    (["--draft-length", "3"], "give --draft too"),
    (["--seed", "-1"], "--seed: must be at least 0, got -1"),
])
def test_run_refuses_bad_options_before_loading_a_model(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli.main(["/no/such/model", "hi", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_every_command_refuses_a_zero_count(capsys):
    from edge.apps import profile as profile_cli
    from edge.apps import serve as serve_cli

    for parse, argv in [(export_cli.parser().parse_args, ["m.gguf", "-o", "out", "--group-size", "0"]),
                        (profile_cli.parser().parse_args, ["--tokens", "0"]),
                        (serve_cli.parser().parse_args, ["--threads", "0"])]:
        with pytest.raises(SystemExit):
            parse(argv)
        assert "must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("cli", ["run", "export", "profile", "serve"])
def test_version_names_what_edge_runs_on(cli, capsys):
    import importlib

    import onnxruntime

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"edge.apps.{cli}").parser().parse_args(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"edge-{cli} (edge " in out and f"onnxruntime {onnxruntime.__version__}" in out and "kernels: " in out


def test_lone_argument_that_is_not_a_path_is_the_prompt():
    args = run_cli.parser().parse_args(["What is 2+2?"])
    assert run_cli.split_model_and_prompt(args) == (None, "What is 2+2?")


def test_flags_may_sit_between_model_and_prompt(package, capsys):
    assert run_cli.main([str(package), "--raw", "t1 t2", "-n", "3", "--context", "64"]) == 0
    assert len(capsys.readouterr().out.split()) == 3


def test_export_paged_package_runs(hf_folder, tmp_path, capsys):
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "int4"), "--paged"]) == 2
    assert "--kernels edge" in capsys.readouterr().err  # int4 paging needs weights-as-inputs at full speed
    assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "paged"), "--paged", "--quant", "fp32"]) == 0
    capsys.readouterr()
    assert run_cli.main([str(tmp_path / "paged"), "t1 t2", "--raw", "-n", "3", "--context", "64"]) == 0
    assert len(capsys.readouterr().out.split()) == 3
    from edge.kernels import library_path

    if library_path() is not None:
        assert export_cli.main([str(hf_folder), "-o", str(tmp_path / "paged4"), "--paged", "--kernels", "edge"]) == 0
        capsys.readouterr()
        assert run_cli.main([str(tmp_path / "paged4"), "t1 t2", "--raw", "-n", "3", "--context", "64"]) == 0
        assert len(capsys.readouterr().out.split()) == 3


def test_a_float32_group_query_attention_graph_is_refused_on_cuda(package, tmp_path):
    """onnxruntime would run that attention on the CPU against a device cache and decode wrong tokens (measured on
    an H100); edge's kernels run there instead."""
    from edge.errors import DeviceError
    from edge.session import check_cuda_graph

    _, imported = tiny_llama(seed=9, initializer_range=0.3)
    with pytest.raises(DeviceError, match="--kernels edge"):
        check_cuda_graph(package / "model.onnx")
    edge_kernels = export_model("tiny", tmp_path / "edge", quant="int4", kernels="edge", model=imported)
    check_cuda_graph(edge_kernels / "model.onnx")


def test_warnings_are_one_line_with_the_command_name(capsys):
    import warnings

    from edge.apps.cli import run_main

    def main():
        warnings.warn("something to know")

    assert run_main(main, "edge-run") == 0
    assert capsys.readouterr().err == "edge-run: warning: something to know\n"
