"""What every edge command shares: user errors become one clear line and exit code 2, not a traceback."""

from __future__ import annotations

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
