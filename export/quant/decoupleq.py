"""decoupleQ-style quantization: treat the integers and the (scale, zero) of each group as two separate problems.

The objective is the Hessian-weighted reconstruction error of each output row, (w - w_hat)^T H (w - w_hat), with
w_hat[k] = scale[g] * code[k] + offset[g] for k in group g. Rows are independent, so everything runs on all rows at
once and "keep the best" is decided per row, which makes the objective non-increasing by construction.

Each round:
1. codes fixed -> (scale, offset) of all groups of a row in closed form: a (2G x 2G) least-squares system per row.
2. (scale, offset) fixed -> codes by GPTQ-style rounding with error feedback under that grid.
Start from the better of RTN and GPTQ (per row); stop after `rounds` or when a round improves less than `tol`.

The float offset maps to MatMulNBits as an integer zero point plus a per-group remainder (see qlinear.py); with
`integer_zeros` the zero is rounded inside the loop instead and the scale re-solved, so no remainder term is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge.export.quant import QuantizationError
from edge.export.quant.gptq import GroupFit, GroupGrid, gptq_core, minmax_fit, prepare
from edge.export.quant.grid import check_bits, max_code, minmax_params, quantize
from edge.export.quant.hessian import damped, check_hessian
from edge.export.quant.packing import num_blocks
from edge.export.quant.qlinear import QuantizedLinear


@dataclass
class DecoupleQConfig:
    bits: int = 2
    group_size: int = 64  # >= K means one group per output channel
    rounds: int = 4
    tol: float = 1e-3  # stop when a round lowers the total objective by less than this fraction
    damp: float = 0.01
    integer_zeros: bool = False
    lazy_block: int = 32

    def check(self) -> None:
        check_bits(self.bits)
        if self.bits == 8:
            raise QuantizationError("decoupleQ targets 2-4 bits; use RTN for 8-bit")
        if self.rounds < 0 or self.group_size < 1:
            raise QuantizationError(f"bad decoupleQ settings rounds={self.rounds} group_size={self.group_size}")


@dataclass
class Solution:
    codes: np.ndarray  # (N, K) float, integer-valued
    scale: np.ndarray  # (N, G)
    offset: np.ndarray  # (N, G): w_hat = scale * code + offset
    objective: np.ndarray  # (N,)

    def improve(self, other: "Solution") -> None:
        """Take the other solution's rows where they are better."""
        better = other.objective < self.objective
        for name in ("codes", "scale", "offset", "objective"):
            getattr(self, name)[better] = getattr(other, name)[better]


@dataclass
class DecoupleQResult:
    layer: QuantizedLinear
    history: list[float] = field(default_factory=list)  # total objective after the start and each half-round


class Problem:
    """One layer's weights, damped Hessian and grouping, padded so K is a whole number of groups."""

    def __init__(self, w: np.ndarray, h: np.ndarray, group_size: int, bits: int):
        n, k = w.shape
        self.k, self.bits = k, bits
        self.gs = min(group_size, k)
        self.groups = num_blocks(k, self.gs)
        kp = self.groups * self.gs
        self.w = np.zeros((n, kp))
        self.w[:, :k] = w
        self.h = np.zeros((kp, kp))
        self.h[:k, :k] = h
        self.hw = self.w @ self.h
        self.s11 = self.h.reshape(self.groups, self.gs, self.groups, self.gs).sum(axis=(1, 3))

    def expand(self, stat: np.ndarray) -> np.ndarray:
        return np.repeat(stat, self.gs, axis=1)

    def objective(self, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
        e = self.w - (self.expand(scale) * self.pad(codes) + self.expand(offset))
        return np.einsum("nk,nk->n", e @ self.h, e)

    def pad(self, codes: np.ndarray) -> np.ndarray:
        out = np.zeros((codes.shape[0], self.w.shape[1]))
        out[:, : codes.shape[1]] = codes
        return out

    def solution(self, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> Solution:
        return Solution(codes, scale, offset, self.objective(codes, scale, offset))

    def solve_grid(self, codes: np.ndarray, integer_zeros: bool) -> tuple[np.ndarray, np.ndarray]:
        """Least-squares (scale, offset) of every group with the codes fixed."""
        q = self.pad(codes)
        scale, offset = self._solve_rows(q, with_offset=True)
        if integer_zeros:
            zero = np.clip(np.round(-offset / safe(scale)), 0, max_code(self.bits))
            scale, _ = self._solve_rows(q - self.expand(zero), with_offset=False)
            offset = -scale * zero
        return scale, offset

    def _solve_rows(self, q: np.ndarray, with_offset: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the normal equations of w_hat = A theta under H, assembled group by group with 2-D GEMMs
        (numpy's stacked matmul is far slower here)."""
        n, g, gs = q.shape[0], self.groups, self.gs
        qg = q.reshape(n, g, gs)
        sqq, sq1 = np.empty((n, g, g)), np.empty((n, g, g))
        for a in range(g):
            r = qg[:, a, :] @ self.h[a * gs : (a + 1) * gs]  # (N, Kp): sum over k in group a of q_k H_kl
            sq1[:, a, :] = r.reshape(n, g, gs).sum(-1)
            sqq[:, a, :] = (r.reshape(n, g, gs) * qg).sum(-1)
        bq = (self.hw.reshape(n, g, gs) * qg).sum(-1)
        if with_offset:
            top = np.concatenate([sqq, sq1], axis=2)
            bottom = np.concatenate([sq1.transpose(0, 2, 1), np.broadcast_to(self.s11, (n, g, g))], axis=2)
            m = np.concatenate([top, bottom], axis=1)
            b = np.concatenate([bq, self.hw.reshape(n, g, gs).sum(-1)], axis=1)
        else:
            m, b = sqq, bq
        ridge = 1e-9 * np.trace(m, axis1=1, axis2=2) / m.shape[1] + 1e-30
        m = m + ridge[:, None, None] * np.eye(m.shape[1])
        theta = np.linalg.solve(m, b[..., None])[..., 0]
        if with_offset:
            return theta[:, :g], theta[:, g:]
        return theta, np.zeros_like(theta)


def safe(scale: np.ndarray) -> np.ndarray:
    return np.where(np.abs(scale) > 1e-30, scale, 1e-30)


def fixed_grid(scale: np.ndarray, offset: np.ndarray) -> GroupFit:
    def fit(w: np.ndarray, d: np.ndarray, g: int) -> GroupGrid:
        s = safe(scale[:, g])
        return GroupGrid(s, -offset[:, g] / s)

    return fit


def start(problem: Problem, w: np.ndarray, u: np.ndarray, cfg: DecoupleQConfig) -> Solution:
    """Better of RTN and GPTQ per row, both with min/max grids."""
    n, k = w.shape
    pw = problem.w.reshape(n, problem.groups, problem.gs)
    scale, zero = minmax_params(pw, cfg.bits)
    rtn = quantize(pw, scale[..., None], zero[..., None], cfg.bits).reshape(n, -1)[:, :k]
    best = problem.solution(rtn, scale, -scale * zero)
    g = gptq_core(w, u, cfg.bits, problem.gs, minmax_fit(cfg.bits), cfg.lazy_block)
    best.improve(problem.solution(g.codes, g.scales, -g.scales * g.zeros))
    return best


def run_decoupleq(w: np.ndarray, h: np.ndarray, cfg: DecoupleQConfig | None = None) -> DecoupleQResult:
    cfg = cfg or DecoupleQConfig()
    cfg.check()
    w, u = prepare(w, h, cfg.damp)
    hd, _ = damped(check_hessian(h, w.shape[1]), cfg.damp)
    problem = Problem(w.astype(np.float64), hd, cfg.group_size, cfg.bits)
    best = start(problem, w, u, cfg)
    history = [float(best.objective.sum())]
    for _ in range(cfg.rounds):
        before = history[-1]
        scale, offset = problem.solve_grid(best.codes, cfg.integer_zeros)
        best.improve(problem.solution(best.codes.copy(), scale, offset))
        history.append(float(best.objective.sum()))
        g = gptq_core(w, u, cfg.bits, problem.gs, fixed_grid(best.scale, best.offset), cfg.lazy_block)
        best.improve(problem.solution(g.codes, best.scale.copy(), best.offset.copy()))
        history.append(float(best.objective.sum()))
        if before - history[-1] <= cfg.tol * before:
            break
    return DecoupleQResult(to_layer(best, problem, cfg), history)


def to_layer(sol: Solution, problem: Problem, cfg: DecoupleQConfig) -> QuantizedLinear:
    s = safe(sol.scale)
    return QuantizedLinear.from_float_zeros(sol.codes, s, -sol.offset / s, cfg.bits, problem.gs, method="decoupleq")


def quantize_decoupleq(w: np.ndarray, h: np.ndarray, cfg: DecoupleQConfig | None = None) -> QuantizedLinear:
    return run_decoupleq(w, h, cfg).layer
