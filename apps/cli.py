"""What every edge command shares: user errors become one clear line and exit code 2, not a traceback (warnings one
line too), and argparse types that refuse bad numbers up front."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable

from edge.errors import EdgeError


def run_main(main: Callable[[], int | None], prog: str) -> int:
    with warnings.catch_warnings():  # the library's warnings as one line each, like the errors
        warnings.showwarning = lambda message, *_, **__: print(f"{prog}: warning: {message}", file=sys.stderr)
        return _run(main, prog)


def _run(main: Callable[[], int | None], prog: str) -> int:
    try:
        return main() or 0
    except EdgeError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130


class VersionAction(argparse.Action):
    """--version: edge's version and what it runs on (onnxruntime, its providers, the kernel library and the CPU
    kernel it picks), the facts a bug report needs; computed only when asked, so startup does not import them."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print the versions of edge, onnxruntime and the kernel library, and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import onnxruntime

        from edge import __version__
        from edge.kernels import kernel_isa, library_path

        library = library_path()
        cuda = library_path(cuda=True)
        kernels = "not built (stock onnxruntime ops only)" if library is None else f"{library} (CPU kernel " \
            f"{kernel_isa(4, 4)})" + (f", CUDA build {cuda} (--device cuda)" if cuda != library else "")
        print(f"{parser.prog} (edge {__version__})\n"
              f"onnxruntime {onnxruntime.__version__}: {', '.join(onnxruntime.get_available_providers())}\n"
              f"kernels: {kernels}")
        parser.exit()


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low, so a bad count is refused before a model is loaded (0 or a negative
    value would otherwise fall back to a default silently, or fail later with a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def float_in(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a number in [low, high] (or (low, high] with low_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            bound = f"at least {low:g}" if high == float("inf") else f"in {'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse
