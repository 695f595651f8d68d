"""The planner as the runtime sees it: a budget in, the plan an Engine allocates from out.

The runtime plans from the packages' manifests alone (shapes and byte sizes), so a budget that cannot be met is
refused before a session, a KV buffer or a draft model exists. The Engine then takes everything it allocates from the
plan: the KV cache holds `plan.context` tokens, prompts are fed in `plan.prefill_chunk` pieces, and a draft model
runs only when the plan keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.memory.budget import BudgetError, ModelSpec, format_bytes, parse_size
from edge.memory.planner import PlanResult, make_planner
from edge.memory.profiles import DeviceProfile, ProfileError, load_profile
from edge.package import Package


@dataclass(frozen=True)
class RuntimePlan:
    """A plan and the budget it was made for, with where the budget came from (for messages)."""

    result: PlanResult
    source: str  # "2.00 GiB", or "profile cpu-laptop-8gb (8.00 GiB)"

    @property
    def context(self) -> int:
        return self.result.plan.context

    @property
    def prefill_chunk(self) -> int:
        return self.result.plan.prefill_chunk

    @property
    def speculative(self) -> bool:
        """The plan keeps the draft model (a model-free drafter's reserved tree is `max_rows`, not this)."""
        return self.result.plan.uses_draft_model

    @property
    def draft_len(self) -> int:
        return self.result.plan.draft_len

    @property
    def max_rows(self) -> int:
        """Tokens a verification step may score: the decoder's logits rows and so a drafter's node cap (the
        speculative decoder caps every tree at decoder.max_rows - 1 drafted nodes)."""
        return self.result.plan.nodes

    def describe(self) -> str:
        return f"budget {self.source}\n{self.result.describe()}"


def is_profile_name(budget: object) -> bool:
    """A budget string that names a device profile rather than a size ('cpu-laptop-8gb', not '2GiB')."""
    if not isinstance(budget, str):
        return False
    text = budget.strip()
    return bool(text) and not (text[0].isdigit() or text[0] == ".")


def plan_package(package: Package, budget: int | float | str, *, profile: str | None = None,
                 context: int | None = None, draft: Package | None = None,
                 free_draft_nodes: int = 0) -> RuntimePlan:
    """The plan for running `package` (and optionally `draft`) within `budget`.

    `budget` is bytes, a size string ('2GiB') or a device profile name (its memory is the budget and its bandwidths
    the speed model); `profile` sets the device explicitly when the budget is a size. `context` caps the planned
    context (the user asked for at most that many tokens). `free_draft_nodes`: the tree a model-free drafter may
    verify (token recycling: 25 nodes with its default 24-node cap), reserved when no draft model is planned; the
    runtime must then size its logits rows and node cap from `RuntimePlan.max_rows`. Raises BudgetError, with the
    lower bound and the budget, when the model cannot run within it.
    """
    device = load_profile(profile) if profile else None
    if is_profile_name(budget):
        named = _budget_profile(str(budget).strip())
        device = device or named
        budget_bytes, source = named.memory_bytes, f"profile {named.name} ({format_bytes(named.memory_bytes)})"
    else:
        budget_bytes = parse_size(budget)
        source = format_bytes(budget_bytes) + (f" on profile {device.name}" if device else "")
    target = ModelSpec.from_manifest(package.manifest, name=package.root.name)
    draft_spec = ModelSpec.from_manifest(draft.manifest, name=draft.root.name) if draft is not None else None
    # A paged package can run with only a window of its layers resident (edge/paging.py).
    planner = make_planner(target, draft=draft_spec, device=device, allow_paging=bool(package.manifest.get("paging")),
                           free_draft_nodes=free_draft_nodes)
    if context is not None and context < planner.min_context:
        planner.min_context = max(1, int(context))  # a user who asks for a tiny context may run in a tiny budget
    try:
        result = planner.plan(budget_bytes, context=context)
    except BudgetError as exc:
        raise BudgetError(f"{exc}" + (f" (the budget: {source})" if source != format_bytes(budget_bytes) else "")) \
            from None
    return RuntimePlan(result, source)


def budget_bytes(budget: int | float | str) -> int:
    """Bytes of a budget given as bytes, a size string or a profile name."""
    if is_profile_name(budget):
        return _budget_profile(str(budget).strip()).memory_bytes
    return parse_size(budget)


def _budget_profile(name: str) -> DeviceProfile:
    """The profile a budget names; a name that is none says that a size would do too ('abc' is a typo of either)."""
    try:
        return load_profile(name)
    except ProfileError as exc:
        raise ProfileError(f"budget {name!r} is neither a memory size (e.g. 2GiB, 512MB) nor a device profile: "
                           f"{exc}") from exc
