"""What speculation did during one generation: how much was drafted and kept, and where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpeculativeStats:
    target_calls: int = 0  # verify calls, with or without a draft
    drafted_calls: int = 0  # verify calls that carried a draft
    drafted: int = 0  # draft nodes verified
    accepted: int = 0  # draft tokens the target kept
    verified_rows: int = 0  # tokens fed to the target over all calls (root plus draft nodes)
    near_ties: int = 0  # multi-token rows too close to a tie to trust; re-decided by a 1-token step
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    by_drafter: dict[str, list[int]] = field(default_factory=dict)  # name -> [calls, drafted, accepted]
    # tokens in a call -> calls: a call's cost grows faster than its rows past a few (int4 on a CPU: 8 rows ~1.5x
    # one, 16 rows ~2.6x), so the mean size alone prices a mix of 1- and 9-row calls ~7% too cheap
    calls_by_rows: dict[int, int] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accepted_per_call(self) -> float:
        """Draft tokens kept per verify call that carried a draft."""
        return self.accepted / self.drafted_calls if self.drafted_calls else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens the target produced per call, its own included (plain decoding: 1)."""
        return (self.accepted + self.target_calls) / self.target_calls if self.target_calls else 0.0

    def record(self, name: str, drafted: int, accepted: int) -> None:
        self.target_calls += 1
        self.verified_rows += 1 + drafted
        self.calls_by_rows[1 + drafted] = self.calls_by_rows.get(1 + drafted, 0) + 1
        if drafted:
            self.drafted_calls += 1
            self.drafted += drafted
            self.accepted += accepted
            row = self.by_drafter.setdefault(name, [0, 0, 0])
            row[0] += 1
            row[1] += drafted
            row[2] += accepted

    def as_dict(self) -> dict:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate, "accepted_per_call": self.accepted_per_call,
                               "tokens_per_call": self.tokens_per_call}

    def summary(self) -> str:
        return (f"drafted {self.drafted}, accepted {self.accepted} ({self.acceptance_rate:.0%}), "
                f"{self.accepted_per_call:.2f} accepted per drafted call, {self.tokens_per_call:.2f} tokens per "
                f"target call ({self.target_calls} calls, {self.near_ties} near-ties re-decided) | draft {self.draft_seconds * 1e3:.0f} ms, "
                f"verify {self.verify_seconds * 1e3:.0f} ms")
