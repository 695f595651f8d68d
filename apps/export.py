"""edge-export SOURCE -o DIR --quant {fp32,int4,spqr,decoupleq}: a GGUF file or Hugging Face folder -> a package."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edge.apps.cli import VersionAction, int_at_least, run_main
from edge.errors import EdgeError


def parser() -> argparse.ArgumentParser:
    from edge.export.pipeline import QUANT_METHODS

    p = argparse.ArgumentParser(prog="edge-export", description=__doc__)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("source", help="a .gguf file or a Hugging Face model folder (config.json + safetensors)")
    p.add_argument("-o", "--output", required=True, help="package folder to write")
    p.add_argument("--quant", choices=QUANT_METHODS, default="int4", help="weight format (default: int4)")
    p.add_argument("--bits", type=int_at_least(1),
                   help="bits for spqr (3 or 4, default 4) and decoupleq (2-4, default 2)")
    p.add_argument("--group-size", type=int_at_least(1),
                   help="quantization group along K (spqr default 16, decoupleq 64)")
    p.add_argument("--stat-bits", type=int_at_least(1),
                   help="spqr: width of the quantized first-level scales and zeros (2-8, default 3; with "
                        "--group-size 32, 8 bits holds a Q4_1 source's block statistics almost exactly at 4.63 bits)")
    p.add_argument("--zeros", choices=["integer", "float"],
                   help="zero points: integer (MatMulNBits' uint8; the int4 default) or float (an integer zero plus "
                        "a per-block offset term in stock ops, float zeros in --kernels edge; the spqr/decoupleq "
                        "default); int4 with float zeros reproduces a Q4_1/Q4_K GGUF source exactly")
    p.add_argument("--embedding-bits", type=int, choices=[4, 8],
                   help="width of the gathered embedding / tied head (default 4; 8 for spqr and for int4 --zeros "
                        "float; 8 is exact for a Q8_0 table)")
    p.add_argument("--head", choices=["rtn", "gptq"],
                   help="the output head's quantization: gptq (calibrated on the float model's final hidden states, "
                        "same bits and speed; SmolLM2's perplexity loss +8.8%% -> +2.0%%) or rtn. Default: gptq where "
                        "the head has weights of its own (untied, or tied with --kernels edge) below 8 bits, on "
                        "Llama-style and Gemma 3 models; rtn otherwise and with --self-draft")
    p.add_argument("--kernels", choices=["stock", "edge"], default="stock",
                   help="stock: onnxruntime's MatMulNBits and GroupQueryAttention; edge: edge.QMatMul and "
                        "edge.Attention from kernels/ (batch-invariant, so speculative decoding stays exact on "
                        "quantized weights; needs the built kernel library; the only packages that run on --device cuda)")
    p.add_argument("--accuracy-level", type=int, choices=[0, 4],
                   help="activations of quantized matmuls: 4 = int8 per block (stock default; with --kernels edge "
                        "about 1.4-1.7x faster matmuls, ~0.5%% matmul error; the default model's), 0 = float "
                        "(--kernels edge default: error under 1e-5); with --kernels edge both keep speculative greedy "
                        "output identical to plain greedy")
    p.add_argument("--kv-dtype", choices=["float32", "float16"], default="float32",
                   help="the KV cache's element type: float16 (with --kernels edge, on the CPU) halves its memory "
                        "and what each step reads of a long context")
    p.add_argument("--force", action="store_true", help="replace the output folder if it exists")
    p.add_argument("--no-tree-attention", action="store_true",
                   help="leave out the attention_bias input (no draft-tree verification)")
    p.add_argument("--paged", action="store_true",
                   help="package whose layers are read from disk on demand (weight paging, for budgets smaller "
                        "than the model): --quant fp32, or --quant int4 --kernels edge")
    p.add_argument("--self-draft", choices=["skip"],
                   help="also write the skip-layer self-draft (draft_skip.onnx over the same weights; its layers "
                        "are chosen by measured agreement on calibration text): edge-run --draft skip. "
                        "fp32 and int4 only. With an existing package as -o and --force unset, only the draft is "
                        "added to it")
    p.add_argument("--draft-head", metavar="WEIGHTS.npz",
                   help="also build a trained draft head beside the model (draft_head.onnx; train the weights with "
                        "`python -m edge.export.draft_head_train SOURCE -o WEIGHTS.npz`): edge-run --draft head, "
                        "and --draft lookup+head uses it where prompt lookup finds nothing")
    p.add_argument("--draft-layers", help="comma-separated layer indices the self-draft keeps (default: measured)")
    return p


def add_self_draft(args: argparse.Namespace, model, out) -> None:
    """--self-draft skip: choose the layers by measurement (or take --draft-layers) and add draft_skip.onnx."""
    from edge.export.self_draft import add_skip_draft

    layers = None
    if args.draft_layers:
        try:
            layers = [int(x) for x in args.draft_layers.split(",")]
        except ValueError:
            raise EdgeError(f"--draft-layers takes comma-separated layer indices, got {args.draft_layers!r}") from None
    record = add_skip_draft(out, model, layers=layers, progress=lambda line: print(line, file=sys.stderr))
    chosen = record["chosen"]
    print(f"self-draft: {chosen['family']} keeps {len(chosen['layers'])}/{model.config.num_layers} layers "
          f"{chosen['layers']}: agreement {chosen['agreement']:.2f}, cost {chosen['cost']:.2f} of a target step, "
          f"predicted x{chosen['predicted_speedup']:.2f} at depth {chosen['depth']}"
          + (" (slower than plain decoding here: edge-run keeps it off)" if chosen["predicted_speedup"] < 1 else ""))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def export() -> None:
        from edge.export.pipeline import export_model

        start = time.perf_counter()
        if (args.self_draft or args.draft_head) and args.paged:
            raise EdgeError("--self-draft and --draft-head need a resident package; leave out --paged")
        if args.draft_layers and not args.self_draft:
            raise EdgeError("--draft-layers goes with --self-draft skip")
        if args.self_draft and (Path(args.output) / "manifest.json").exists() and not args.force:
            from edge.export.load import load_model

            add_self_draft(args, load_model(args.source), Path(args.output))  # keep the package, add the draft
            print(f"added the self-draft to {args.output} in {time.perf_counter() - start:.1f} s")
            return
        if args.paged:
            from edge.export.load import load_model

            if args.kv_dtype != "float32":
                raise EdgeError("--kv-dtype float16 is not available with --paged yet; leave it out")
            from edge.export.paged import export_paged

            out = export_paged(load_model(args.source), args.output, tree_attention=not args.no_tree_attention,
                               overwrite=args.force, quant=args.quant, kernels=args.kernels,
                               accuracy_level=args.accuracy_level, head=args.head)
        else:
            model = None
            if args.self_draft:
                from edge.export.load import load_model

                if args.quant not in ("fp32", "int4"):
                    raise EdgeError(f"--self-draft supports --quant fp32 and int4, not {args.quant}")
                model = load_model(args.source)  # loaded once for both graphs
            out = export_model(args.source, args.output, quant=args.quant, overwrite=args.force,
                               tree_attention=not args.no_tree_attention, progress=sys.stderr.isatty(),
                               kernels=args.kernels, bits=args.bits, group_size=args.group_size, model=model,
                               zeros=args.zeros, embedding_bits=args.embedding_bits, stat_bits=args.stat_bits,
                               head=args.head or ("rtn" if args.self_draft else None),  # the draft re-creates it
                               draft_head=args.draft_head, kv_dtype=args.kv_dtype,
                               **({} if args.accuracy_level is None else {"accuracy_level": args.accuracy_level}))
            if args.self_draft:
                add_self_draft(args, model, out)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"wrote {out} ({size / 2**20:.1f} MiB, {args.quant}) in {time.perf_counter() - start:.1f} s")

    return run_main(export, "edge-export")


if __name__ == "__main__":
    sys.exit(main())
