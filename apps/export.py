"""edge-export SOURCE -o DIR --quant {fp32,int4}: a GGUF file or Hugging Face folder -> an edge package."""

from __future__ import annotations

import argparse
import sys
import time

from edge.apps.cli import run_main


def parser() -> argparse.ArgumentParser:
    from edge.export.pipeline import QUANT_METHODS

    p = argparse.ArgumentParser(prog="edge-export", description=__doc__)
    p.add_argument("source", help="a .gguf file or a Hugging Face model folder (config.json + safetensors)")
    p.add_argument("-o", "--output", required=True, help="package folder to write")
    p.add_argument("--quant", choices=QUANT_METHODS, default="int4", help="weight format (default: int4)")
    p.add_argument("--force", action="store_true", help="replace the output folder if it exists")
    p.add_argument("--no-tree-attention", action="store_true",
                   help="leave out the attention_bias input (no draft-tree verification)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def export() -> None:
        from edge.export.pipeline import export_model

        start = time.perf_counter()
        out = export_model(args.source, args.output, quant=args.quant, overwrite=args.force,
                           tree_attention=not args.no_tree_attention, progress=sys.stderr.isatty())
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"wrote {out} ({size / 2**20:.1f} MiB, {args.quant}) in {time.perf_counter() - start:.1f} s")

    return run_main(export, "edge-export")


if __name__ == "__main__":
    sys.exit(main())
