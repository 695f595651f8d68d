"""One entry point for every model source: a .gguf file or a Hugging Face folder."""

from __future__ import annotations

import os
from pathlib import Path

from edge.errors import ModelFormatError
from edge.export.source import ImportedModel


def load_model(path: str | os.PathLike[str]) -> ImportedModel:
    """Import `path`: a GGUF file (by its magic, whatever its name) or a folder with config.json + safetensors."""
    path = Path(path)
    if path.is_dir():
        from edge.export.hf import load_hf

        return load_hf(path)
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF" or path.suffix.lower() == ".gguf":
            from edge.export.gguf import load_gguf

            return load_gguf(path)
        raise ModelFormatError(
            f"{path}: not a model edge can import; give a .gguf file or a Hugging Face folder "
            "(config.json, *.safetensors, tokenizer.json)"
        )
    raise ModelFormatError(f"{path}: no such file or folder")
