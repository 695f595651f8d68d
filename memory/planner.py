"""The planner: the fastest plan whose predicted peak fits a memory budget.

Policy, in order, so that more budget never buys less:
1. Weights stay resident if they can; paging (pinning some layers and streaming the rest from disk) is the last resort
   and only when asked for (`allow_paging`), at the minimum context.
2. Context comes next: the largest context (up to the one asked for, in steps of `context_step`) at which the smallest
   plan (no draft, smallest prefill chunk) still fits. Context is what a user notices running out; speed never costs it.
3. The rest of the budget buys speed: draft model on or off, draft length or tree, prefill chunk and pinned layers are
   chosen to minimise the predicted time of a reference request (`prompt_tokens` in, `new_tokens` out).

Speed model: a decode step streams the weights once, so a 1-token step of a model takes bytes_read / memory bandwidth;
an S-token step costs cost(S) times that (a measured cost curve); paged layers are read from disk once per step,
overlapped with compute. No step takes less than the device's dispatch time per layer times the layers (a GPU's
launches: an H200 decoded SmolLM2 at 2.65 ms a token where its bandwidth alone would allow 0.02 ms). A drafted level
is accepted with probability alpha; a tree of `tree_width` candidates per level along the draft's top-1 path accepts
some candidate with 1 - (1 - alpha)^width (candidates taken as independent, an optimistic approximation), which for
width 1 gives the chain's (1 - alpha^(k+1)) / (1 - alpha).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edge.memory.budget import (
    FLOAT_BYTES, RUNTIME_OVERHEAD_BYTES, BudgetError, MemoryEstimate, MemoryModel, ModelSpec, Plan, format_bytes,
    parse_size,
)
from edge.memory.profiles import DeviceProfile, load_profile

# Cost of an S-token step relative to a 1-token step, measured on this project's CPU with onnxruntime 1.31.1 and the
# onnxruntime-genai SmolLM2-135M graphs (shared/notes/peers.md): MatMulNBits int4 (accuracy_level 4) and fp32 MatMul.
INT4_COST_POINTS = {1: 1.0, 2: 1.64, 4: 2.89, 8: 3.06, 16: 4.16}
FP32_COST_POINTS = {1: 1.0, 2: 1.02, 4: 1.10, 8: 1.31, 16: 1.78}
# On a GPU: an H200, edge.QMatMul's CUDA kernel, the default int4 package (benchmarks/RESULTS.md, kernels, session 29).
CUDA_COST_POINTS = {1: 1.0, 2: 1.08, 4: 1.22, 8: 1.43, 16: 1.78}

# Acceptance rate per drafted token when none is given: Leviathan et al. 2023 ("Fast Inference from Transformers via
# Speculative Decoding", table 3) report alpha between about 0.5 and 0.8 for their target/draft pairs; 0.6 is a
# middling value to be replaced by the measured rate of the real pair.
DEFAULT_ALPHA = 0.6

# Bandwidths used when a budget is given in bytes without a device profile.
DEFAULT_SPEED_PROFILE = "cpu-laptop-16gb"

MIN_CONTEXT = 256
CONTEXT_STEP = 256
MIN_CHUNK = 16
MAX_CHUNK = 512
MAX_NODES = 16  # the measured cost curves stop at 16-token steps
MAX_TREE_WIDTH = 4
NO_DRAFT = "no draft model given"


@dataclass(frozen=True)
class CostCurve:
    """Cost of an S-token step in 1-token steps: piecewise linear through measured points, extended past the last
    point along the last segment's slope (prefill chunks are longer than anything a decode step measures)."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, points: Mapping[int, float]) -> "CostCurve":
        items = tuple(sorted((int(s), float(c)) for s, c in points.items()))
        if not items or items[0][0] != 1 or any(c <= 0 for _, c in items):
            raise ValueError(f"a cost curve needs a point at 1 token and positive costs, got {dict(points)}")
        if any(b[1] < a[1] for a, b in zip(items, items[1:])):
            raise ValueError(f"a cost curve must not decrease with more tokens, got {dict(points)}")
        return cls(items)

    def __call__(self, tokens: int) -> float:
        sizes = [s for s, _ in self.points]
        if len(self.points) == 1:
            return self.points[0][1] * tokens
        i = min(max(bisect_right(sizes, tokens) - 1, 0), len(self.points) - 2)
        (s0, c0), (s1, c1) = self.points[i], self.points[i + 1]
        return max(c0 + (c1 - c0) * (tokens - s0) / (s1 - s0), self.points[0][1])


INT4_COST = CostCurve.of(INT4_COST_POINTS)
FP32_COST = CostCurve.of(FP32_COST_POINTS)
CUDA_COST = CostCurve.of(CUDA_COST_POINTS)


def default_cost_curve(quant: str, kind: str = "cpu") -> CostCurve:
    """The measured curve of the device kind and weight format (on the CPU integer formats use the int4 curve, the
    only one measured; on a GPU the one curve measured there)."""
    if kind == "cuda":
        return CUDA_COST
    return FP32_COST if quant in FLOAT_BYTES else INT4_COST


def expected_tokens(alpha: float, draft_len: int, tree_width: int = 1) -> float:
    """Tokens a verification step yields on average, the target's own token included."""
    level = 1.0 - (1.0 - alpha) ** tree_width
    return 1.0 + sum(alpha ** (i - 1) * level for i in range(1, draft_len + 1))


@dataclass(frozen=True)
class SpeedModel:
    """Seconds per step from bytes moved; absolute numbers are upper bounds, their ratios pick the plan."""

    memory_bandwidth: float  # bytes/s
    disk_bandwidth: float  # bytes/s
    target_cost: CostCurve
    draft_cost: CostCurve
    alpha: float
    layer_dispatch: float = 0.0  # seconds a step takes per layer at least (DeviceProfile.layer_dispatch_seconds)

    def target_step(self, model: MemoryModel, plan: Plan, tokens: int) -> float:
        compute = self.target_cost(tokens) * model.target.bytes_read_per_token / self.memory_bandwidth
        dispatch = model.target.config.num_layers * self.layer_dispatch
        return max(compute, dispatch, model.disk_bytes_per_pass(plan) / self.disk_bandwidth)

    def draft_step(self, model: MemoryModel, tokens: int) -> float:
        compute = self.draft_cost(tokens) * model.draft.bytes_read_per_token / self.memory_bandwidth
        return max(compute, model.draft.config.num_layers * self.layer_dispatch)

    def decode_rate(self, model: MemoryModel, plan: Plan) -> float:
        """Generated tokens per second. A model-free drafter's tree is a memory reservation, not a predicted
        speed-up: the runtime measures whether and how deep it pays (edge.speculative's adaptive depth)."""
        if not plan.uses_draft_model:
            return 1.0 / self.target_step(model, plan, 1)
        step = plan.draft_len * self.draft_step(model, 1) + self.target_step(model, plan, plan.nodes)
        return expected_tokens(self.alpha, plan.draft_len, plan.tree_width) / step

    def prefill_seconds(self, model: MemoryModel, plan: Plan, prompt: int) -> float:
        full, rest = divmod(prompt, plan.prefill_chunk)
        seconds = full * self.target_step(model, plan, plan.prefill_chunk)
        seconds += self.target_step(model, plan, rest) if rest else 0.0
        if plan.uses_draft_model:
            seconds += full * self.draft_step(model, plan.prefill_chunk) + (self.draft_step(model, rest) if rest else 0)
        return seconds


@dataclass(frozen=True)
class Bounds:
    """The smallest budgets that matter, both at the minimum context and the smallest prefill chunk."""

    runs_at_all: int  # no draft
    speculation_pays: int | None  # smallest speculative plan predicted faster than plain decoding; None: never
    min_context: int
    why_no_speculation: str = ""

    def describe(self) -> str:
        if self.speculation_pays is not None:
            spec = (f"speculative decoding pays from {format_bytes(self.speculation_pays)} "
                    f"({self.speculation_pays:,} bytes)")
        elif self.why_no_speculation == NO_DRAFT:
            spec = "speculative decoding is not considered (no draft model given)"
        else:
            spec = f"speculative decoding never pays here ({self.why_no_speculation})"
        return (f"the model runs at all from {format_bytes(self.runs_at_all)} ({self.runs_at_all:,} bytes) with a "
                f"{self.min_context}-token context; {spec}")


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    memory: MemoryEstimate
    budget: int
    bounds: Bounds
    decode_tokens_per_s: float
    plain_decode_tokens_per_s: float  # the same plan without the draft
    prefill_tokens_per_s: float
    tokens_per_step: float

    def describe(self) -> str:
        p = self.plan
        if p.uses_draft_model:
            draft = f"draft {p.draft_len} levels x {p.tree_width} ({p.nodes} nodes per verification)"
        elif p.speculative:
            draft = f"model-free drafting, up to {p.nodes} nodes per verification"
        else:
            draft = "no draft"
        paging = ("all layers resident" if p.resident_layers is None
                  else f"{p.resident_layers} layers pinned, rest paged")
        return "\n".join([
            f"plan: context {p.context}, prefill chunk {p.prefill_chunk}, {draft}, {paging}",
            f"predicted peak {format_bytes(self.memory.peak)} of budget {format_bytes(self.budget)}",
            f"predicted decode {self.decode_tokens_per_s:.1f} tok/s (plain {self.plain_decode_tokens_per_s:.1f}), "
            f"prefill {self.prefill_tokens_per_s:.1f} tok/s",
            self.memory.table(),
        ])


class Planner:
    """Chooses plans for one target (and optional draft) on one device's speed."""

    def __init__(self, model: MemoryModel, speed: SpeedModel, *, min_context: int = MIN_CONTEXT,
                 context_step: int = CONTEXT_STEP, min_chunk: int = MIN_CHUNK, max_chunk: int = MAX_CHUNK,
                 max_nodes: int = MAX_NODES, max_tree_width: int = MAX_TREE_WIDTH, allow_paging: bool = False,
                 prompt_tokens: int = 512, new_tokens: int = 256, free_draft_nodes: int = 0):
        """`free_draft_nodes`: the verification tree a model-free drafter (token recycling, prompt lookup) may
        propose, root included; when no draft model is planned, the plan reserves as much of it as fits after the
        context (a plan's `nodes` is then what the runtime caps the drafter's tree at)."""
        self.model, self.speed = model, speed
        self.max_context = model.target.config.max_context
        if model.draft is not None:
            self.max_context = min(self.max_context, model.draft.config.max_context)
        self.min_context = min(min_context, self.max_context)
        self.context_step = context_step
        self.min_chunk, self.max_chunk = min_chunk, max(max_chunk, min_chunk)
        self.max_nodes, self.max_tree_width = max_nodes, max_tree_width
        self.allow_paging = allow_paging
        self.prompt_tokens, self.new_tokens = prompt_tokens, new_tokens
        self.free_draft_nodes = free_draft_nodes

    # -- candidates ---------------------------------------------------------------------------------------------

    def _chunks(self, context: int) -> list[int]:
        sizes, size = {self.max_chunk}, self.min_chunk
        while size < self.max_chunk:
            sizes.add(size)
            size *= 2
        return sorted({min(s, context) for s in sizes})

    def _draft_shapes(self) -> Iterator[tuple[int, int]]:
        yield 0, 1
        if self.model.draft is None:
            return
        for width in range(1, self.max_tree_width + 1):
            for length in range(1, (self.max_nodes - 1) // width + 1):
                yield length, width

    def _smallest(self, context: int, paged: bool) -> Plan:
        return Plan(context=context, prefill_chunk=min(self.min_chunk, context), resident_layers=0 if paged else None)

    def _contexts(self, cap: int) -> list[int]:
        grid = list(range(self.min_context, cap, self.context_step))
        return grid + [cap] if cap >= self.min_context else [self.min_context]

    # -- bounds ---------------------------------------------------------------------------------------------------

    def bounds(self) -> Bounds:
        residencies = [False, True] if self.allow_paging else [False]
        runs = min(self.model.estimate(self._smallest(self.min_context, paged)).peak for paged in residencies)
        if self.model.draft is None:
            return Bounds(runs, None, self.min_context, NO_DRAFT)
        pays = []
        for paged in residencies:
            base = self._smallest(self.min_context, paged)
            plain = self.speed.decode_rate(self.model, base)
            for length, width in self._draft_shapes():
                plan = replace(base, draft_len=length, tree_width=width)
                if length and self.speed.decode_rate(self.model, plan) > plain:
                    pays.append(self.model.estimate(plan).peak)
        why = "" if pays else (f"at alpha {self.speed.alpha:g} no draft length or tree up to {self.max_nodes} nodes "
                               "beats plain decoding with this cost curve")
        return Bounds(runs, min(pays) if pays else None, self.min_context, why)

    # -- planning -------------------------------------------------------------------------------------------------

    def _fits(self, plan: Plan, budget: int) -> bool:
        return self.model.estimate(plan).peak <= budget

    def _largest_context(self, budget: int, cap: int) -> int:
        """Largest grid context at which the smallest resident plan fits (peak grows with context: bisect)."""
        grid = self._contexts(cap)
        lo, hi = 0, len(grid) - 1  # grid[lo] fits: the caller checked the minimum context
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(self._smallest(grid[mid], paged=False), budget):
                lo = mid
            else:
                hi = mid - 1
        return grid[lo]

    def _most_pinned(self, plan: Plan, budget: int) -> Plan | None:
        """The plan with as many layers pinned as fit, or None when not even the streaming window fits."""
        if not self._fits(replace(plan, resident_layers=0), budget):
            return None
        lo, hi = 0, self.model.target.config.num_layers - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(replace(plan, resident_layers=mid), budget):
                lo = mid
            else:
                hi = mid - 1
        return replace(plan, resident_layers=lo)

    def _request_seconds(self, plan: Plan) -> float:
        prompt = min(self.prompt_tokens, plan.context // 2)
        decode = self.speed.decode_rate(self.model, plan)
        return self.speed.prefill_seconds(self.model, plan, prompt) + self.new_tokens / decode

    def _candidates(self, context: int, budget: int, paged: bool) -> Iterator[Plan]:
        for chunk in self._chunks(context):
            for length, width in self._draft_shapes():
                plan = Plan(context=context, prefill_chunk=chunk, draft_len=length, tree_width=width)
                if paged:
                    plan = self._most_pinned(plan, budget)
                    if plan is not None:
                        yield plan
                elif self._fits(plan, budget):
                    yield plan

    def plan(self, budget: int | str, context: int | None = None) -> PlanResult:
        """The plan for `budget` bytes, with a context of at most `context` tokens (default: the model's maximum)."""
        budget = parse_size(budget)
        cap = self.max_context if context is None else max(1, min(int(context), self.max_context))
        cap = max(cap, self.min_context)
        if self._fits(self._smallest(self.min_context, paged=False), budget):
            paged, chosen_context = False, self._largest_context(budget, cap)
        elif self.allow_paging and self._fits(self._smallest(self.min_context, paged=True), budget):
            paged, chosen_context = True, self.min_context
        else:
            bounds = self.bounds()
            raise BudgetError(
                f"budget {format_bytes(budget)} ({budget:,} bytes) is too small for {self.model.target.name}: "
                f"{bounds.describe()}. Raise the budget, use a smaller or lower-bit model"
                + ("" if self.allow_paging else ", or export it for weight paging (edge-export --paged)"))
        best = min(self._candidates(chosen_context, budget, paged),
                   key=lambda p: (self._request_seconds(p), self.model.estimate(p).peak))
        return self._result(self._with_free_tree(best, budget), budget)

    def _with_free_tree(self, plan: Plan, budget: int) -> Plan:
        """Reserve the model-free drafter's tree in a plan without a draft model: the largest that still fits."""
        if plan.speculative:
            return plan
        for nodes in range(self.free_draft_nodes, 1, -1):
            reserved = replace(plan, draft_len=nodes - 1, tree_width=1, draft_model=False)
            if self._fits(reserved, budget):
                return reserved
        return plan

    def _result(self, plan: Plan, budget: int) -> PlanResult:
        plain = replace(plan, draft_len=0, tree_width=1, draft_model=True)
        prompt = min(self.prompt_tokens, plan.context // 2) or 1
        speed = self.speed
        return PlanResult(
            plan=plan, memory=self.model.estimate(plan), budget=budget, bounds=self.bounds(),
            decode_tokens_per_s=speed.decode_rate(self.model, plan),
            plain_decode_tokens_per_s=speed.decode_rate(self.model, plain),
            prefill_tokens_per_s=prompt / speed.prefill_seconds(self.model, plan, prompt),
            tokens_per_step=(expected_tokens(speed.alpha, plan.draft_len, plan.tree_width)
                             if plan.uses_draft_model else 1.0))


def resolve_budget(budget: int | str) -> tuple[int, DeviceProfile | None]:
    """Bytes and device for a budget given as bytes, a size string ('2GiB', '512MB') or a device profile name."""
    if isinstance(budget, str) and budget.strip() and not budget.strip()[0].isdigit() and budget.strip()[0] != ".":
        profile = load_profile(budget.strip())
        return profile.memory_bytes, profile
    return parse_size(budget), None


def _spec(model: ModelSpec | Mapping[str, Any] | str | Path) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return ModelSpec.from_manifest(dict(model))
    return ModelSpec.from_package(model)


def make_planner(target: ModelSpec | Mapping[str, Any] | str | Path, *, draft: Any = None,
                 device: DeviceProfile | str | None = None, alpha: float | None = None,
                 cost_curve: Mapping[int, float] | None = None, draft_cost_curve: Mapping[int, float] | None = None,
                 **options: Any) -> Planner:
    """A planner for a target (ModelSpec, manifest dict or package folder), an optional draft, and a device."""
    if isinstance(device, str):
        device = load_profile(device)
    target_spec, draft_spec = _spec(target), (_spec(draft) if draft is not None else None)
    speed_device = device or load_profile(DEFAULT_SPEED_PROFILE)
    overhead = (device.runtime_overhead_bytes if device and device.runtime_overhead_bytes
                else RUNTIME_OVERHEAD_BYTES)
    # On CUDA the device receives one copy of each weight (the host copy is not in the device budget).
    model = MemoryModel(target_spec, draft_spec, overhead_bytes=overhead,
                        prepack_fraction=0.0 if speed_device.kind == "cuda" else None)
    speed = SpeedModel(
        memory_bandwidth=speed_device.memory_bandwidth,
        disk_bandwidth=speed_device.disk_read_bandwidth,
        target_cost=(CostCurve.of(cost_curve) if cost_curve
                     else default_cost_curve(target_spec.quant, speed_device.kind)),
        draft_cost=(CostCurve.of(draft_cost_curve) if draft_cost_curve
                    else default_cost_curve(draft_spec.quant if draft_spec else target_spec.quant, speed_device.kind)),
        alpha=DEFAULT_ALPHA if alpha is None else alpha,
        layer_dispatch=speed_device.layer_dispatch_seconds,
    )
    if not 0.0 <= speed.alpha < 1.0:
        raise BudgetError(f"acceptance rate alpha must be in [0, 1), got {speed.alpha}")
    return Planner(model, speed, **options)


def plan_for(target: ModelSpec | Mapping[str, Any] | str | Path, budget: int | str, *, draft: Any = None,
             context: int | None = None, **options: Any) -> PlanResult:
    """The plan for a budget in bytes, a size string, or a device profile name (which also sets the speeds)."""
    budget_bytes, profile = resolve_budget(budget)
    if profile is not None:
        options.setdefault("device", profile)
    return make_planner(target, draft=draft, **options).plan(budget_bytes, context=context)
