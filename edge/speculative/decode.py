"""The speculative generation loop: draft, verify in one target call, keep the accepted path, repeat.

The loop yields tokens exactly as plain decoding would (greedy: the same ids; sampling: the same distribution),
and keeps `history` equal to what the target's KV cache holds, so the engine's prefix reuse keeps working.
Drafters are tried in order (model-free first): the first that proposes something supplies the draft.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from edge.model import Decoder
from edge.sampling import Sampler, SamplingParams
from edge.speculative.adaptive import AdaptiveDepth, CostCurve, FixedDepth, Pace
from edge.speculative.drafter import Draft, Drafter
from edge.speculative.stats import SpeculativeStats
from edge.speculative.verify import Verdict, accept_greedy, accept_sampled, tree_inputs

QUIET_EVERY = 4  # a switched-off learner observes one verify call in this many
DORMANT_EVERY = 2  # a cheap drafter with every kind of draft switched off guesses on one step in this many
SURE = 0.8  # the target's probability of the root at and above which the root counts as sure (root_is_sure)
KNOWN_WEIGHT = 8.0  # pseudo-trials behind a drafter's known first-guess acceptance (~8 verify calls' evidence)


def root_is_sure(row: np.ndarray | None, scratch: np.ndarray | None = None, top: float | None = None) -> bool:
    """Whether the target gave its top token at least SURE probability in `row` (its logits for the root, softmax
    at temperature 1): where it hesitates, the text is not being copied and a short lookup match rarely passes.

    It runs after a step has left the caches cold, on most steps of a switched-off prompt lookup, where each numpy
    call costs tens of microseconds whatever its size: so three or four calls, into `scratch` (the row's shape; none
    given: allocated) rather than a fresh array, and none for the maximum where the step gave it (`top`, Decoder.top).
    Measured in the loop: ~145 us a call, against ~210 us summing only the logits within 16 of the maximum (fewer
    exps, but a mask, a gather and their allocations)."""
    if row is None:
        return False
    shifted = np.subtract(row, row.max() if top is None else top, out=scratch)
    return float(np.add.reduce(np.exp(shifted, out=shifted))) <= 1.0 / SURE


def known_prior(drafter: Drafter, kind: str = "") -> dict:
    """AdaptiveDepth's first-level prior for a drafter's kind of draft, where its acceptance was measured before use
    (Drafter.kind_acceptance, else known_acceptance); {} where nothing is known (the policy's weak default)."""
    known = drafter.kind_acceptance.get(kind, drafter.known_acceptance)
    return {} if known is None else {"successes": KNOWN_WEIGHT * known, "trials": KNOWN_WEIGHT, "known": True}


def after_root(tokens: list[int], draft: Draft, verdict: Verdict, greedy: bool) -> int | None:
    """The token the target produced after the root, to score shadow guesses by; None where it is not a draw from
    the target's own distribution: a near-tie left undecided, or a sampled draft's rejected first token (the token
    then comes from the residual distribution)."""
    if len(verdict.path) > 1:
        return tokens[verdict.path[1]]
    return verdict.next_token if greedy or not len(draft) else None


class Speculator:
    """Drafters plus a draft-length policy per drafter. draft_length=None: adaptive (measured cost curve).

    Greedy exactness: a multi-token step computes the same logits as 1-token steps only up to rounding (fp32:
    ~4e-5; int4 MatMulNBits takes another kernel path for several rows: up to ~0.9). Where a verify row's top-2
    gap is under `margin`, its token is decided by a 1-token step instead, as plain decoding would.
    """

    def __init__(self, drafters: Sequence[Drafter], draft_length: int | None = None, max_depth: int = 8,
                 threads: int | None = None, margin: float | None = None):
        if not drafters:
            raise ValueError("speculation needs at least one drafter")
        self.drafters = list(drafters)
        self.draft_length, self.max_depth, self.threads = draft_length, max_depth, threads
        # None: from the package's measured multi-token vs 1-token logit deviation (see CostCurve.margin).
        self.margin = margin
        self.policies: dict[str, AdaptiveDepth | FixedDepth] = {}
        self._kinds: dict[str, list[AdaptiveDepth | FixedDepth]] = {}  # drafter name -> its policies, one a kind
        self.plain = Pace()  # plain 1-token steps against the cost curve, shared by the adaptive policies
        # Drafter name -> its verify calls against the curve, shared by its kinds' policies: how a verify call runs
        # now (the past's length, the host) is the same for a 1-gram's draft as for an 8-gram's, and a kind priced
        # only by its own calls drafted its first few on the cached curve. Measured after a ~1,500-token
        # conversation, each run with new policies (open chat, 4 reps, /tmp script): prompt lookup 0.93 and 0.92x of
        # plain against 0.91 and 0.89 with a pace per kind, lookup+head 0.92 and 1.00 against 0.91 and 0.95.
        self.verify: dict[str, Pace] = {}
        self.curve: CostCurve | None = None
        self.stats = SpeculativeStats()
        self.steps = 0  # verify calls so far, for learners that observe only some of them
        # This step's switched-off cheap drafters and the first-level guesses they would have drafted
        self._shadows: list[tuple[AdaptiveDepth, list[int]]] = []
        self._scratch: np.ndarray | None = None  # root_is_sure's, one logit row

    @property
    def name(self) -> str:
        return "+".join(d.name for d in self.drafters)

    def _policy(self, drafter: Drafter, decoder: Decoder, kind: str = "") -> AdaptiveDepth | FixedDepth:
        """One per drafter and kind of draft. Policies outlive a generation: acceptance learned in one chat turn
        informs the next."""
        key = f"{drafter.name}/{kind}" if kind else drafter.name
        if key not in self.policies:
            if self.draft_length is not None:
                self.policies[key] = FixedDepth(self.draft_length)
            else:
                measured = drafter.predicted_speedup
                self.policies[key] = AdaptiveDepth(self._curve(decoder), drafter.size, self.max_depth,
                                                   enabled=measured is None or measured >= 1, plain=self.plain,
                                                   verify=self.verify.setdefault(drafter.name, Pace()),
                                                   shadowed=drafter.cheap, **known_prior(drafter, kind))
            self._kinds.setdefault(drafter.name, []).append(self.policies[key])
        return self.policies[key]

    def prepare(self, decoder: Decoder) -> None:
        """Measure (or load) the package's cost curve now rather than inside the first generation: measuring takes
        about a second once per package and machine, which a first run's tokens/s would otherwise include."""
        if self.draft_length is None:
            self._curve(decoder)

    def _curve(self, decoder: Decoder) -> CostCurve:
        if self.curve is None:
            self.curve = CostCurve.cached(decoder, self.threads)
            for d in self.drafters:
                d.fit(self.curve)
        return self.curve

    def _switched_off(self, drafter: Drafter) -> bool:
        """Whether the adaptive policy has this drafter off for now. Its begin() (a draft model's prefill of the
        whole prompt) is then skipped: a probe catches up if one comes. Measured: the int4 draft's prompt prefill
        cost ~110 ms of a ~1.5 s open-chat generation in which the policy never drafted."""
        policy = self.policies.get(drafter.name)
        return isinstance(policy, AdaptiveDepth) and not policy.drafting()

    def _margin(self, decoder: Decoder) -> float:
        """Top-2 logit gap under which a multi-token row is not trusted to pick plain decoding's token."""
        if self.margin is None:
            self.margin = self._curve(decoder).margin
        return self.margin

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()

    def _draft(self, decoder: Decoder, context: list[int], depth_cap: int, node_cap: int,
               root_row: np.ndarray | None, root_max: float | None = None
               ) -> tuple[Drafter | None, Draft, AdaptiveDepth | FixedDepth | None, float]:
        """root_row: the target's logits the root was chosen from (None: not known), for confidence_kinds; root_max:
        their maximum where the step gave it (Decoder.top)."""
        start = time.perf_counter()
        self._shadows.clear()
        for drafter in self.drafters:
            # A cheap drafter's guess comes first, to be judged by its kind; one switched off guesses a single level,
            # which is scored against the target's next token instead of drafted (AdaptiveDepth.shadow).
            draft = None
            if drafter.cheap and not self._disabled(drafter):
                if self.steps % DORMANT_EVERY and self._dormant(drafter):
                    continue
                draft = drafter.propose(context, 1 if self._waiting(drafter) else min(self.max_depth, depth_cap))
                if not len(draft):
                    continue  # no guess this step: nothing to judge
            if draft is not None and draft.kind in drafter.confidence_kinds:
                draft.kind += "/sure" if self._root_is_sure(root_row, root_max) else "/unsure"
            policy = self._policy(drafter, decoder, draft.kind if draft is not None else "")
            depth = min(policy.depth(), depth_cap)
            while depth > 0 and drafter.size(depth) > node_cap:
                depth -= 1
            if depth <= 0:
                if draft is not None and isinstance(policy, AdaptiveDepth) and policy.off:
                    self._shadows.append((policy, [t for t, d in zip(draft.tokens, draft.depths()) if d == 1]))
                continue
            draft = draft.truncated(depth) if draft is not None else drafter.propose(context, depth)
            if len(draft):
                return drafter, draft, policy, time.perf_counter() - start
            if isinstance(policy, AdaptiveDepth):
                policy.declined()
        return None, Draft(), None, time.perf_counter() - start

    def _root_is_sure(self, row: np.ndarray | None, top: float | None = None) -> bool:
        if row is not None and (self._scratch is None or self._scratch.shape != row.shape):
            self._scratch = np.empty_like(row)
        return root_is_sure(row, self._scratch, top)

    def _observe(self, tokens: list[int], rows: np.ndarray, path: list[int], produced: list[int] | None) -> None:
        """Show the drafters that learn from the target (token recycling) the accepted path's rows.

        What this costs matters as much as the step: after a step has streamed the weights through the caches,
        every numpy call on a 49k-logit row takes tens of microseconds, and the top-k of one row ~0.2 ms (3% of an
        int4 step; measured in the loop, 4x a warm micro-benchmark). So only the accepted path's rows, as views (a
        copy allocates afresh each step, and a fresh allocation of that size is fresh pages to fault in: see
        edge/sampling.py), and a learner switched off for losing sees every
        `QUIET_EVERY`-th step only: enough to keep its table fresh for its shadow guesses. One that needs only the
        tokens greedy decoding produced (`produced`, one per path node; None when sampling) sees every step.
        """
        self.steps += 1
        learners = [d for d in self.drafters if self._sees(d, produced is not None)]
        if not learners or not path:  # no path: a near-tie at the root, nothing decided to learn from
            return
        seen = rows[:len(path)] if path[-1] == len(path) - 1 else [rows[i] for i in path]
        for d in learners:
            d.observe([tokens[i] for i in path], seen, produced)

    def _sees(self, drafter: Drafter, greedy: bool) -> bool:
        """Whether a learner observes this step (see _observe)."""
        if not drafter.learns:
            return False
        if greedy and drafter.observes_cheaply():
            return True
        return self.steps % QUIET_EVERY == 0 or not self._waiting(drafter)

    def _follow(self, decoder: Decoder, row: int) -> None:
        """Hand a draft head the hidden row behind the next root's logits (the verify row it was chosen from)."""
        for d in self.drafters:
            if d.follows_hidden:
                hidden = getattr(decoder, "hidden", None)  # a paged decoder has none
                d.follow(None if hidden is None else hidden[row])

    def _waiting(self, drafter: Drafter) -> bool:
        """Switched off by its adaptive policy until a probe or its shadow guesses switch it back on."""
        policy = self.policies.get(drafter.name)
        return isinstance(policy, AdaptiveDepth) and (policy.off or not policy.enabled)

    def _dormant(self, drafter: Drafter) -> bool:
        """Every kind of draft it has made is switched off, waiting for a shadow guess to pass. It is then asked on
        one step in DORMANT_EVERY only: its guess, the root's confidence and the policies' bookkeeping cost a
        switched-off prompt lookup ~0.1 ms a step after the target's step has left the caches cold (~2% of an
        int4 step), and evidence on every other step still turns it back on within two tokens of a passing guess."""
        kinds = self._kinds.get(drafter.name)
        return bool(kinds) and all(isinstance(p, AdaptiveDepth) and p.shadowed and p.off for p in kinds)

    def _disabled(self, drafter: Drafter) -> bool:
        """Measured to lose at every depth: never drafts, never probes, not even asked for a shadow guess."""
        policy = self.policies.get(drafter.name)
        return isinstance(policy, AdaptiveDepth) and not policy.enabled

    def _score_shadows(self, produced: int | None) -> None:
        """Tell the switched-off drafters of this step whether their guess was the token the target produced after
        the root (None: not decided yet, a near-tie: nothing learned). _draft clears the list for the next step."""
        if produced is not None:
            for policy, guesses in self._shadows:
                policy.shadow(produced in guesses)

    def tokens(self, decoder: Decoder, history: list[int], logits: np.ndarray, params: SamplingParams,
               max_tokens: int) -> Iterator[int]:
        """Yield up to `max_tokens` tokens after `history` (the tokens in the cache; `logits` follow its last).

        The consumer may stop at any yield; the cache and `history` are then cut back to the tokens before the
        last one yielded, exactly as plain decoding leaves them.
        """
        self.stats = SpeculativeStats()  # now, not at the first next(): the engine reads it right away
        return self._tokens(decoder, history, logits, params, max_tokens, self.stats)

    def _tokens(self, decoder: Decoder, history: list[int], logits: np.ndarray, params: SamplingParams,
                max_tokens: int, stats: SpeculativeStats) -> Iterator[int]:
        sampler = Sampler(params)
        root, fresh, single = sampler(logits), True, False  # first: `logits` is a view the next step overwrites
        root_row: np.ndarray | None = logits  # what the target said of the root: read before the next step
        root_max: float | None = None  # their maximum, where the step that chose the root gave it (Decoder.top)
        start = time.perf_counter()
        for d in self.drafters:
            d.prepare(params)
            if not self._switched_off(d):
                d.begin(history)
        self._follow(decoder, -1)  # `logits` are the last row of the step before (the prompt's)
        stats.draft_seconds += time.perf_counter() - start
        margin = self._margin(decoder) if params.greedy else 0.0
        base, yielded = len(history), 0
        try:
            while True:
                if fresh:
                    yielded += 1  # counted before the yield: the consumer may stop right there
                    yield root
                if yielded >= max_tokens or len(history) >= decoder.cache.capacity:
                    return  # a full cache: the engine reports finish_reason "context"
                depth_cap = 0 if single else max_tokens - yielded - 1  # never draft what would not be emitted
                node_cap = min(decoder.cache.capacity - len(history), decoder.max_rows) - 1
                drafter, draft, policy, draft_seconds = self._draft(decoder, history + [root], depth_cap, node_cap,
                                                                    root_row, root_max)
                stats.draft_seconds += draft_seconds
                start = time.perf_counter()
                past = decoder.cache.length
                tokens, positions, bias = tree_inputs(past, root, draft)
                rows = decoder.step(tokens, positions, list(range(len(tokens))), bias)
                top = getattr(decoder, "top", None)  # each row's argmax and maximum, where the graph gives them
                if params.greedy:
                    verdict = accept_greedy(draft, rows, margin if len(tokens) > 1 else 0.0, top)
                else:
                    verdict = accept_sampled(draft, rows, sampler)
                path = verdict.path if verdict.next_token is not None else verdict.path[:-1]
                self._score_shadows(after_root(tokens, draft, verdict, params.greedy))
                produced = [tokens[j] for j in verdict.path[1:]] + [verdict.next_token]
                self._observe(tokens, rows, path, produced[:len(path)] if params.greedy else None)
                if path:  # empty: a near-tie at the root itself, re-decided by the 1-token step that follows
                    self._follow(decoder, path[-1])
                decoder.cache.keep(past, path)
                history.extend(tokens[i] for i in path)
                verify_seconds = time.perf_counter() - start
                stats.verify_seconds += verify_seconds
                stats.record(drafter.name if drafter else "", len(draft), len(verdict.accepted))
                if policy is not None:
                    policy.update(max(draft.depths()), len(verdict.accepted), draft_seconds, verify_seconds,
                                  len(tokens), drafter.catch_up_seconds)
                elif self.draft_length is None and len(tokens) == 1:
                    self.plain.observe(verify_seconds, self._curve(decoder).seconds[0])  # sizes[0] is 1
                for i in path[1:]:
                    yielded += 1
                    yield tokens[i]
                if verdict.next_token is None:  # a near-tie in a multi-token row: decide it with a 1-token step
                    stats.near_ties += 1
                    root, fresh, single, root_row = tokens[verdict.path[-1]], len(verdict.path) > 1, True, None
                    root_max = None
                else:
                    root, fresh, single, root_row = verdict.next_token, True, False, rows[verdict.path[-1]]
                    root_max = (float(top[verdict.path[-1], 1]) if top is not None and top[verdict.path[-1], 0] >= 0
                                else None)
        finally:
            keep = base + max(yielded - 1, 0)
            if len(history) > keep:
                decoder.cache.trim(keep)
                del history[keep:]
