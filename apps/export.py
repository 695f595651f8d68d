"""edge-export SOURCE -o DIR --quant {fp32,int4,spqr,decoupleq}: a GGUF file or Hugging Face folder -> a package."""

from __future__ import annotations

import argparse
import sys
import time

from edge.apps.cli import run_main
from edge.errors import EdgeError


def parser() -> argparse.ArgumentParser:
    from edge.export.pipeline import QUANT_METHODS

    p = argparse.ArgumentParser(prog="edge-export", description=__doc__)
    p.add_argument("source", help="a .gguf file or a Hugging Face model folder (config.json + safetensors)")
    p.add_argument("-o", "--output", required=True, help="package folder to write")
    p.add_argument("--quant", choices=QUANT_METHODS, default="int4", help="weight format (default: int4)")
    p.add_argument("--bits", type=int, help="bits for spqr (3 or 4, default 4) and decoupleq (2-4, default 2)")
    p.add_argument("--group-size", type=int, help="quantization group along K (spqr default 16, decoupleq 64)")
    p.add_argument("--kernels", choices=["stock", "edge"], default="stock",
                   help="stock: onnxruntime's MatMulNBits; edge: edge.QMatMul from kernels/ (batch-invariant, so "
                        "speculative decoding stays exact on quantized weights; needs the built kernel library)")
    p.add_argument("--force", action="store_true", help="replace the output folder if it exists")
    p.add_argument("--no-tree-attention", action="store_true",
                   help="leave out the attention_bias input (no draft-tree verification)")
    p.add_argument("--paged", action="store_true",
                   help="float32 package whose layers are read from disk on demand (weight paging, for budgets "
                        "smaller than the model)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def export() -> None:
        from edge.export.pipeline import export_model

        start = time.perf_counter()
        if args.paged:
            from edge.export.load import load_model
            from edge.export.paged import export_paged

            if args.quant != "fp32":
                raise EdgeError("--paged packages hold float32 weights for now; add --quant fp32")
            out = export_paged(load_model(args.source), args.output, tree_attention=not args.no_tree_attention,
                               overwrite=args.force)
        else:
            out = export_model(args.source, args.output, quant=args.quant, overwrite=args.force,
                               tree_attention=not args.no_tree_attention, progress=sys.stderr.isatty(),
                               kernels=args.kernels, bits=args.bits, group_size=args.group_size)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"wrote {out} ({size / 2**20:.1f} MiB, {args.quant}) in {time.perf_counter() - start:.1f} s")

    return run_main(export, "edge-export")


if __name__ == "__main__":
    sys.exit(main())
