"""edge-profile on a tiny package: the plan's components, predicted against measured by phase, and the chart."""

from __future__ import annotations

import dataclasses
import sys
from html.parser import HTMLParser

import pytest

from edge.apps import profile as profile_cli
from edge.export.pipeline import export_model
from edge.memory.profiles import profile_names
from tiny_models import tiny_llama

COMPONENTS = ("weights_target", "kv_target", "logits", "activations", "overhead", "prepack", "tokenizer", "peak")
PHASES = ("imports", "session", "prefill", "decode")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    _, imported = tiny_llama(seed=3, max_position_embeddings=512)
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    return export_model("tiny", tmp_path_factory.mktemp("p") / "pkg", quant="fp32", model=imported)


class Tags(HTMLParser):
    """Counts start tags and checks that every opened non-void tag is closed in order."""

    VOID = {"meta", "br", "img", "link", "input", "hr", "rect", "line", "circle", "polyline", "path"}

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        for name, value in attrs:
            if name in ("src", "href") and value and "://" in value:
                self.external.append(value)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def parse_html(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    tags.close()
    return tags


def test_profile_prints_components_phases_and_writes_a_valid_html_chart(package, tmp_path, capsys):
    chart = tmp_path / "out.html"
    argv = [str(package), "--budget", "1GiB", "--context", "64", "--tokens", "4", "--threads", "1",
            "--chart", str(chart)]
    assert profile_cli.main(argv) == 0
    out = capsys.readouterr().out
    for word in COMPONENTS + PHASES:
        assert word in out
    # the verdict itself depends on this pytest process's size (other tests' torch, ...), not on the tiny model
    assert "plan: context 64" in out and "the budget of 1.00 GiB" in out
    assert "decode 4 tokens at" in out
    text = chart.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    tags = parse_html(text)
    assert not tags.errors and not tags.stack and not tags.external and tags.counts.get("script", 0) == 0
    assert tags.counts["svg"] == 2 and tags.counts["polyline"] >= 2 and tags.counts["table"] == 3
    assert [p.name for p in chart.parent.iterdir()] == ["out.html"]  # no temporary file left behind


def test_png_without_matplotlib_falls_back_to_html(package, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    argv = [str(package), "--context", "32", "--tokens", "2", "--threads", "1", "--chart", str(tmp_path / "m.png")]
    assert profile_cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "matplotlib is not installed" in captured.err
    assert not (tmp_path / "m.png").exists() and "<svg" in (tmp_path / "m.html").read_text()
    assert "no budget" in captured.out


def test_unknown_profile_and_small_budget_exit_2(package, capsys):
    assert profile_cli.main([str(package), "--profile", "pocket-calculator"]) == 2
    err = capsys.readouterr().err
    assert "unknown device profile" in err and all(name in err for name in profile_names())
    assert profile_cli.main([str(package), "--budget", "2MiB"]) == 2
    assert "too small" in capsys.readouterr().err
    assert profile_cli.main([str(package), "--kv-dtype", "float16"]) == 2  # stock ops: GroupQueryAttention
    assert "--kernels edge" in capsys.readouterr().err


def test_list_prints_every_profile(capsys):
    assert profile_cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in profile_names())


def test_prediction_fill_counts_only_written_kv():
    from edge.memory.budget import MemoryModel, ModelSpec, Plan
    from edge.config import ModelConfig

    cfg = ModelConfig(architecture="llama", vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_context=1024)
    memory = MemoryModel(ModelSpec.from_config(cfg, "fp32")).estimate(Plan(context=1024))
    assert profile_cli._at_fill(memory, 1024, 1024) == memory.run_peak
    half = profile_cli._at_fill(memory, 512, 1024)
    assert half == memory.run_peak - memory.kv_target // 2


def test_a_gguf_is_profiled_from_its_cached_export(tmp_path, capsys, monkeypatch):
    from tiny_models import tiny_gguf

    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    tiny_gguf(gguf, "llama", bias=False, tied=True)
    assert profile_cli.main([str(gguf), "--budget", "1GiB", "--context", "64", "--tokens", "2", "--threads", "1"]) == 0
    assert "plan: context 64" in capsys.readouterr().out
    assert any((tmp_path / "cache" / "models" / "exports").iterdir())
