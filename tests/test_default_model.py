"""The default model's cache: named exports get a folder per revision, and an older revision's folder (or a retired
export's) goes."""

from __future__ import annotations

import json

from edge import default_model


def test_a_new_export_revision_replaces_the_older_cached_one(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path))
    models = tmp_path / "models"
    old = models / "smollm2-135m-instruct-int4-edge"  # revision 1 had no suffix
    older = models / "smollm2-135m-instruct-int4-edge-r2"
    other = models / "smollm2-135m-instruct-int4-edge-acc0"  # a benchmark's own export: kept
    retired = [models / "smollm2-135m-instruct-int4-edge-cuda",  # the GPU's own export until session 28
               models / "exports" / "my-model-0123456789ab-int4-edge-cuda",
               # another source's exports by older revisions (edge.cached_export)
               models / "exports" / "my-model-0123456789ab-int4-edge",
               models / "exports" / "my-model-0123456789ab-int4-edge-r6"]
    current = models / "exports" / f"my-model-0123456789ab-int4-edge-r{default_model.EXPORT_REVISIONS['int4-edge']}"
    for folder in (old, older, other, current, *retired):
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    exported = []

    def fake_export(source, target, **options):
        target.mkdir(parents=True)
        (target / "manifest.json").write_text(json.dumps(options, default=str))
        exported.append(options)

    import edge.export.pipeline as pipeline

    monkeypatch.setattr(pipeline, "export_model", fake_export)
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "model.gguf")
    target = default_model.default_package("int4-edge")
    assert target.name == f"smollm2-135m-instruct-int4-edge-r{default_model.EXPORT_REVISIONS['int4-edge']}"
    assert exported == [{**default_model.EXPORTS["int4-edge"], "progress": True}]
    assert not old.exists() and not older.exists() and other.exists()
    assert not any(folder.exists() for folder in retired) and current.exists()
    assert default_model.default_package("int4-edge") == target and len(exported) == 1  # cached now
