"""What every edge command shares: user errors become one clear line and exit code 2, not a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from edge.errors import EdgeError


def run_main(main: Callable[[], int | None], prog: str) -> int:
    try:
        return main() or 0
    except EdgeError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130


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
