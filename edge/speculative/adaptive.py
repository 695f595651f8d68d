"""How long a draft should be: the package's measured cost curve against a running acceptance estimate.

A verify call over S tokens costs c(S); on this CPU c(2)/c(1) is ~1.0 for float32 weights but ~1.6 for int4
MatMulNBits, so the same acceptance pays on one package and loses on the other. The curve is measured once per
package and thread count and cached. With a_i the rate at which level i is accepted once the levels before it were,
a draft of depth d yields 1 + a_1 + a_1 a_2 + ... + a_1...a_d tokens per call; the controller picks the d with most
tokens per second, and turns drafting off when even the best d is slower than plain decoding, probing again with
one level after `probe_every` plain steps, then at longer intervals while probes lose. A cheap drafter (prompt
lookup, token recycling) needs no probes: the guess it would have drafted is scored against the target's token, and
it starts off, drafting once a guess has passed.

The curve is measured alone; real calls run beside other work. Each policy therefore scales the curve by the pace
its verify calls are observed to run at, and compares with the pace of plain 1-token steps observed in the same
generation (Pace): whatever slows the steps that follow a draft (another session's threads on the same cores, the
loop's own work) lowers the predicted gain, while a machine that is slow for everyone does not.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from edge.default_model import cache_dir, sha256_file
from edge.model import Decoder

# Up to 32: a token-recycling tree verifies up to 25 rows, and past 16 the CUDA kernel takes another path (a norm
# kernel ahead of the matmul), so extrapolating from 16 rows would guess its cost.
SIZES = (1, 2, 4, 8, 16, 32)
GUARDED_DEVIATION = 0.01
RUN_STEPS = 3  # 1-token steps in a run timed per round of CostCurve.measure, in place of the turn's


BUSY_SHARE = 0.25  # other processes' share of our cores above which a measured curve is used but not cached


def _our_cores() -> list[int]:
    """The cores this process may run on; empty where the platform does not say (then: all of them)."""
    affinity = getattr(psutil.Process(), "cpu_affinity", None)  # not on macOS
    return list(affinity() or []) if affinity else []


def _cpu_snapshot() -> tuple[float, float, float]:
    """Wall time, busy seconds of the cores this process may run on (steal included: another VM's turn) and this
    process's own CPU seconds."""
    cores = set(_our_cores())
    per_cpu = psutil.cpu_times(percpu=True)
    busy = sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for i, t in enumerate(per_cpu) if not cores or i in cores)
    own = psutil.Process().cpu_times()
    return time.perf_counter(), busy, own.user + own.system


def others_share(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """How much of our cores other processes used between two snapshots (0: none, 1: all of them)."""
    wall = after[0] - before[0]
    cores = len(_our_cores()) or psutil.cpu_count() or 1
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others) / (wall * cores) if wall > 0 else 0.0


def measured_sizes(decoder: Decoder) -> tuple[int, ...]:
    """The step sizes a curve times: no more rows than a step may score (a planned decoder may score fewer) and
    small enough to leave at least as long a past in the cache."""
    return tuple(s for s in SIZES if s <= decoder.max_rows and 2 * s <= decoder.cache.capacity) or (1,)


def _single_step(decoder: Decoder, token: int, base: int) -> float:
    start = time.perf_counter()
    decoder.step([token])
    seconds = time.perf_counter() - start
    decoder.cache.trim(base)
    return seconds


@dataclass
class CostCurve:
    """Seconds of one target call by number of tokens in it (linear between measured sizes)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    deviation: float = 0.0  # largest |logit| difference of a multi-token row from the 1-token step

    @property
    def margin(self) -> float:
        """Top-2 gaps below this may be flipped by the multi-token step's rounding: decide them one token at a time.

        Only for rounding-level deviations (float32: ~4e-5, so the guard costs nothing). A kernel whose multi-row
        path is a different computation (int4 MatMulNBits: ~0.8) also leaves different K/V in the cache, which
        shifts later 1-token steps as well, so no margin restores identity there; measured: it re-decided a third
        of the steps and still differed on as many prompts. Those differences are reported as near-ties.
        """
        return 2.0 * self.deviation if self.deviation < GUARDED_DEVIATION else 0.0

    def __call__(self, tokens: int) -> float:
        if tokens in self.sizes:  # what np.interp returns there, without its overhead (the policy asks every step)
            return float(self.seconds[self.sizes.index(tokens)])
        if tokens > self.sizes[-1]:  # past the measured range: proportional to the largest size
            return self.seconds[-1] * tokens / self.sizes[-1]
        return float(np.interp(tokens, self.sizes, self.seconds))

    def relative(self) -> dict[int, float]:
        return {s: t / self.seconds[0] for s, t in zip(self.sizes, self.seconds)}

    @classmethod
    def measure(cls, decoder: Decoder, sizes: tuple[int, ...] | None = None, past: int = 128,
                repeats: int = 9) -> CostCurve:
        """Time steps of each size on top of a past of >= `past` tokens; the cache content is left as it was.

        Sizes take turns, so a burst of load from elsewhere slows all of them rather than bending the curve
        (measured with each size timed in a block: the same package's S=1 step came out 8.1 and 9.6 ms in two
        runs, and its S=2/S=1 ratio 1.13 and 1.29). The 1-token cost, though, is plain decoding's, the baseline
        every draft is weighed against, and plain decoding runs 1-token steps back to back: a 1-token step right
        after a larger one costs 5-10% more (measured on a Zen 5, benchmarks/step_ab.py), which made the policy
        expect that much more from every draft than it delivered. So each round also times a short run of
        1-token steps, and the curve's S=1 is their median. Also compares each multi-token step's logits with
        1-token steps over the same tokens: the largest difference is how far a verify row may be from what
        plain decoding computes.
        """
        sizes = measured_sizes(decoder) if sizes is None else sizes
        cache, length = decoder.cache, decoder.cache.length
        base = min(max(length, past), cache.capacity - max(sizes))
        if base < 0:
            raise ValueError(f"a context of {cache.capacity} tokens is too small to measure {max(sizes)}-token steps")
        saved = [a[:, :, base:length].copy() for a in cache.arrays]  # what the probes overwrite, put back after
        cache.trim(min(length, base))
        if cache.length < base:
            decoder.step([i % decoder.config.vocab_size for i in range(base - cache.length)])
        probe = [(7 * i + 11) % decoder.config.vocab_size for i in range(max(sizes))]
        single = np.stack([decoder.step([t])[0].copy() for t in probe])
        cache.trim(base)
        times: dict[int, list[float]] = {size: [] for size in sizes}
        deviation = 0.0
        for rep in range(repeats + 1):  # the first round warms each size's buffers
            for size in sizes:
                start = time.perf_counter()
                rows = decoder.step(probe[:size], logits_rows=list(range(size)))
                if rep:
                    times[size].append(time.perf_counter() - start)
                else:
                    deviation = max(deviation, float(np.abs(rows - single[:size]).max()))
                cache.trim(base)
            if rep and sizes[0] == 1:  # plain decoding's pace: a run of 1-token steps, its first a transition
                run = [_single_step(decoder, probe[0], base) for _ in range(RUN_STEPS + 1)]
                times[1][-1:] = run[1:]
        seconds = [float(np.median(times[size])) for size in sizes]
        for a, kept in zip(cache.arrays, saved):
            a[:, :, base:length] = kept
        cache.length = length
        # Noise must not make a bigger step look cheaper than a smaller one.
        return cls(tuple(sizes), tuple(np.maximum.accumulate(seconds).tolist()), deviation)

    @classmethod
    def cached(cls, decoder: Decoder, threads: int | None) -> CostCurve:
        """The curve for this package and thread count, measured on first use and kept in the edge cache.

        Only a curve measured while other processes left our cores alone is kept: one measured beside another
        benchmark on the same 2 cores came out S=2 1.26x, S=8 1.89x against 1.06x, 1.45x quiet (session 15), and a
        kept curve steers every later generation. A busy measurement serves this process only."""
        key = sha256_file(decoder.package.root / "manifest.json")[:16]
        if decoder.device != "cpu":  # a GPU's curve is another shape altogether (flat up to 16 rows)
            key += f"-{decoder.device}"
        if decoder.package.kv_dtype != decoder.package.graph_kv_dtype:  # the same graph run with the other cache
            key += f"-{decoder.package.kv_dtype}"
        if decoder.package.custom_ops:  # the same graph costs what the kernel library built here makes it cost
            from edge.kernels import library_path

            library = library_path()
            if library is not None:
                key += "-" + sha256_file(library)[:8]
        rows = max(measured_sizes(decoder))
        path = cache_dir() / "speculative" / f"cost-v4-{key}-t{threads or 0}-r{rows}.json"
        if path.exists():
            data = json.loads(path.read_text())
            return cls(tuple(data["sizes"]), tuple(data["seconds"]), data["deviation"])
        before = _cpu_snapshot()
        curve = cls.measure(decoder)
        if others_share(before, _cpu_snapshot()) > BUSY_SHARE:
            return curve
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump({"sizes": list(curve.sizes), "seconds": list(curve.seconds), "deviation": curve.deviation}, tmp)
        os.replace(tmp.name, path)
        return curve


@dataclass
class Pace:
    """How much slower than the cost curve some kind of call really runs: a running ratio of observed to predicted
    seconds (1 until observed; the first observation is taken as is, later ones weigh `weight`)."""

    ratio: float = 1.0
    weight: float = 0.2
    observed: int = 0

    def observe(self, seconds: float, predicted: float) -> None:
        ratio = seconds / predicted
        self.ratio = ratio if not self.observed else (1 - self.weight) * self.ratio + self.weight * ratio
        self.observed += 1


class FixedDepth:
    """Always the same draft depth: for tests and for measuring a drafter on its own."""

    def __init__(self, depth: int):
        self.fixed = depth

    def depth(self) -> int:
        return self.fixed

    def update(self, depth: int, accepted: int, draft_seconds: float, verify_seconds: float | None = None,
               rows: int = 1, catch_up_seconds: float = 0.0) -> None:
        pass


@dataclass
class AdaptiveDepth:
    """Draft depth from per-level acceptance: level i's rate is P(token i accepted | tokens before it accepted).

    One rate for all levels (a geometric model) is wrong for copying drafters: a prompt-lookup draft either follows
    the copied span for many tokens or breaks at once, so its first level is ~0.5 and its deeper ones ~0.9. With
    one rate the policy saw ~0.5 everywhere and never drafted past 1-2 tokens on int4, whose verify cost rises
    steeply. Each level's prior is the rate of the level before it, so good first levels earn deeper drafts until
    deeper levels show otherwise.

    Costs are observed, not assumed. The verify call is the curve's cost scaled by the pace this drafter's verify
    calls are seen to run at, against the pace of plain 1-token steps (`plain`, shared by the speculator's
    policies). A draft model also costs its levels and its catch-up: the tokens it must read before drafting, those
    the target produced while another drafter (prompt lookup) supplied the draft. Measured (fp32 target, int4
    draft, 2 cores): with the draft session spinning, a 1-token verify right after a draft took 48 ms instead of
    23 ms, and each return from off cost the draft a catch-up of 110-170 ms. The curve shows neither; a policy that
    saw only the curve predicted a gain on open chat where the run measured x0.84.
    """

    curve: CostCurve
    size: object  # depth -> nodes verified (the drafter's size())
    max_depth: int = 8
    probe_every: int = 16
    min_gain: float = 1.05  # draft only when the model promises at least this: its estimates are noisy
    decay: float = 0.9  # weight of older evidence per update: acceptance drifts with the text
    successes: float = 1.0  # prior for the first level: 1 of 3 accepted, so a new drafter earns its drafts
    trials: float = 3.0
    draft_seconds_per_level: float = 0.0
    catch_up_seconds_per_step: float = 0.0  # reading missed tokens before a draft, while drafting is on
    prior_weight: float = 2.0  # pseudo-trials of a deeper level's prior (the rate of the level before it)
    enabled: bool = True  # False: a drafter measured to lose at every depth; never drafts, never probes
    max_probe_every: int = 256  # the longest wait between probes
    probe_budget: float = 0.02  # what losing probes may cost, as a share of the plain steps between them
    # A cheap drafter's policy: while off, the first guesses its drafter would have made are scored against the
    # tokens the target produced anyway (shadow), so it needs no paid probes and turns back on as soon as they pass.
    shadowed: bool = False
    # The prior (successes, trials) was measured for this kind of draft, not guessed: a shadowed policy whose prior
    # promises a gain then starts on (see __post_init__).
    known: bool = False
    plain: Pace = field(default_factory=Pace)  # plain 1-token steps against curve(1)
    verify: Pace = field(default_factory=Pace)  # this drafter's verify calls against the curve at their size
    off: bool = field(default=False, init=False)  # switched off for losing; waiting for the next probe
    probing: bool = field(default=False, init=False)  # the last depth() was a probe
    off_steps: int = field(default=0, init=False)
    probe_interval: int = field(default=0, init=False)  # steps between probes now (0: probe_every)
    level_successes: list[float] = field(init=False)  # Python floats: 8 numbers updated every step
    level_trials: list[float] = field(init=False)
    verify_costs: list[float] | None = field(default=None, init=False)  # curve(1 + size(d)), d = 1..max_depth

    def __post_init__(self) -> None:
        self.level_successes = [float(self.successes)] + [0.0] * (self.max_depth - 1)
        self.level_trials = [float(self.trials)] + [0.0] * (self.max_depth - 1)
        # A shadowed policy starts off: its first guesses are scored for free, so it drafts once one has passed
        # rather than paying verify rows to learn what a kind of draft is worth. Unless that is known: then waiting
        # for a shadow guess costs a verify call per kind and generation where drafting pays, as in a copy's first
        # 8-token match (PromptLookup.kind_acceptance).
        self.off = self.shadowed and not (self.known and self.best()[1] >= self.min_gain)

    def rates(self) -> np.ndarray:
        """Acceptance rate of each level 1..max_depth given the levels before it."""
        return np.array(self._rates())

    def _rates(self) -> list[float]:
        """rates() in Python floats. The policy runs every step on 8 numbers, after a target step has left the caches
        cold, where numpy's per-call overhead is the whole cost: best() took 92 us a call in the loop with numpy
        arrays, 24 us with floats; update() 85 -> 34 us (session 19, same results bit for bit)."""
        out, prior = [], 0.0
        for i, (s, t) in enumerate(zip(self.level_successes, self.level_trials)):
            rate = s / t if i == 0 else (s + self.prior_weight * prior) / (t + self.prior_weight)
            prior = min(rate, 0.99)
            out.append(prior)
        return out

    @property
    def acceptance(self) -> float:
        """The first level's rate: how often a draft's first token is right."""
        return self._rates()[0]

    def plain_seconds(self) -> float:
        """What a plain 1-token step costs now. Until one is seen, as fast as the verify calls against the curve:
        a generation whose first steps all draft would otherwise compare its verify calls, slowed by whatever
        slows the machine now, with plain steps at the curve's cached pace (measured: a draft head switched off
        after its first draft, 1.78x the curve against an assumed 1.00, while plain steps ran at 1.62x)."""
        return self.curve(1) * (self.plain.ratio if self.plain.observed else self.verify_pace())

    def verify_pace(self) -> float:
        """The pace of this drafter's verify calls; until one is seen, the plain steps' (nothing known is added)."""
        return self.verify.ratio if self.verify.observed else self.plain.ratio

    def speedups(self) -> list[float]:
        """Expected tokens per second at depths 1..max_depth relative to plain decoding: d levels yield 1 + r1 +
        r1 r2 + ... + r1...rd tokens for a verify call over 1 + size(d) tokens (its cost looked up once) and d
        draft levels."""
        if self.verify_costs is None:
            self.verify_costs = [self.curve(1 + self.size(d)) for d in range(1, self.max_depth + 1)]
        pace, plain = self.verify_pace(), self.plain_seconds()
        gains, product, total = [], 1.0, 0.0
        for depth, (rate, cost) in enumerate(zip(self._rates(), self.verify_costs), start=1):
            product *= rate
            total += product
            seconds = cost * pace + depth * self.draft_seconds_per_level + self.catch_up_seconds_per_step
            gains.append((1.0 + total) * plain / seconds)
        return gains

    def best(self) -> tuple[int, float]:
        gains = self.speedups()
        top = max(gains)
        return gains.index(top) + 1, top

    def drafting(self) -> bool:
        """Whether the policy drafts now (rather than waiting for its next probe)."""
        return self.enabled and not self.off and self.best()[1] >= self.min_gain

    def depth(self) -> int:
        """Draft depth for the next step; 0: none.

        Once off, only a probe can switch drafting back on. While off nothing is learned about acceptance or draft
        cost, so a rising estimate is only the plain pace's noise, and every return costs a draft model its
        catch-up over the tokens it missed (measured: 110-170 ms, 5-7 plain steps, for the int4 draft of fp32).
        """
        self.probing = False
        if not self.enabled:
            return 0
        if not self.off:
            depth, gain = self.best()
            if gain >= self.min_gain:
                self.probe_interval = 0
                return depth
            self.off, self.off_steps = True, 0
        if self.shadowed:
            return 0  # shadow() switches it back on
        self.off_steps += 1
        interval = self.probe_interval or self.probe_every
        if self.off_steps >= interval:  # losing for now; look again, the text may have changed
            # Draft one level: the cheapest verify that says whether first tokens pass again (measured: at its best
            # depth a token-recycling probe verified a 24-node tree, 5-6 plain int4 steps, twice per 64 tokens).
            self.off, self.probing, self.probe_interval = False, True, interval
            return 1  # the next call decides, with the probe's outcome, whether drafting stays on
        return 0

    def shadow(self, passed: bool) -> None:
        """While off: whether the first level of the draft its drafter would have made held the token the target
        produced. Evidence for the first level at no cost (no verify rows), weighed like a verify call's; once the
        first level promises a gain again, drafting is back on. A probe costs a verify call over the drafted token
        (1.22x a plain step on the int4 CPU curve) and came every 16 steps: 1.4% of plain decoding's speed per
        switched-off drafter where it never passes (open chat), for evidence once every 16 steps instead of every
        step."""
        if not (self.shadowed and self.enabled and self.off):
            return
        self.level_trials[0] = self.level_trials[0] * self.decay + 1
        self.level_successes[0] = self.level_successes[0] * self.decay + passed
        if passed and self.best()[1] >= self.min_gain:  # a miss lowers every depth's gain: no need to look
            self.off = False

    def declined(self) -> None:
        """The drafter proposed nothing at the depth given (a draft head unsure of its first guess). A probe that
        learned nothing is not spent: the next step probes again, at the interval it was given."""
        if self.probing:
            self.off, self.probing = True, False
            self.off_steps = self.probe_interval

    def update(self, depth: int, accepted: int, draft_seconds: float, verify_seconds: float | None = None,
               rows: int = 1, catch_up_seconds: float = 0.0) -> None:
        """One verify call's outcome: `accepted` of `depth` levels (each level tried until the first miss), the
        seconds spent drafting them (`catch_up_seconds` of it reading missed tokens first), and the verify call's
        seconds over `rows` tokens (None: not timed).

        A probe's catch-up covers the whole time drafting was off: a one-off, not a cost of drafting on. What the
        probe cost beyond a plain step (its drafting, catch-up included, and its larger verify) sets how long until
        the next probe instead, should this one lose: probes may spend `probe_budget` of the plain steps between
        them. A draft head's losing probe (~1 ms) comes back every `probe_every` steps; a draft model's (a catch-up
        of 110-170 ms) after hundreds. Doubling the wait after each loss instead kept a draft head away from code
        for 128-256 steps after a rewrite had switched it off (measured: drafted 0 tokens over three code prompts).
        """
        if verify_seconds is not None:
            self.verify.observe(verify_seconds, self.curve(rows))
        tried = min(accepted + 1, depth, self.max_depth)
        passed = min(accepted, self.max_depth)
        self.level_trials = [t * self.decay + (i < tried) for i, t in enumerate(self.level_trials)]
        self.level_successes = [s * self.decay + (i < passed) for i, s in enumerate(self.level_successes)]
        if self.probing:
            extra = draft_seconds + (0.0 if verify_seconds is None else verify_seconds - self.plain_seconds())
            affordable = round(extra / (self.probe_budget * self.plain_seconds()))
            self.probe_interval = min(max(self.probe_every, affordable), self.max_probe_every)
        else:
            self.catch_up_seconds_per_step = 0.8 * self.catch_up_seconds_per_step + 0.2 * catch_up_seconds
        self.probing = False
        per_level = (draft_seconds - catch_up_seconds) / max(depth, 1)
        self.draft_seconds_per_level = per_level if not self.draft_seconds_per_level else \
            0.8 * self.draft_seconds_per_level + 0.2 * per_level
