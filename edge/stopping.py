"""Stop strings over streamed text.

Text that could still turn out to be the start of a stop string is held back, so a stream never shows a user
half of "</answer>" and then has to take it back.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add generated text; return what is safe to show now. Sets `stopped` when a stop string appeared."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out
        hold = self._held_suffix()
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _held_suffix(self) -> int:
        """Length of the longest suffix of pending that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:n]):
                    best = n
                    break
        return best
