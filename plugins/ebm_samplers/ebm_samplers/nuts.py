"""The No-U-Turn Sampler: multinomial, iterative (no recursion), batched over chains in lockstep.

Each iteration draws ``p ~ N(0, M)`` and doubles a trajectory in a random direction per chain
until it makes a U-turn (the generalised criterion of Betancourt 2017, with the sub-trajectory
checks of the iterative scheme of Phan, Pradhan & Jankowiak 2019), diverges, or reaches
``2^max_tree_depth − 1`` leapfrog steps. The next state is drawn from the trajectory with
probability ∝ ``exp(−H)``: uniformly-progressive within a subtree, biased towards the new subtree
when merging (as in Stan).

All chains build subtrees of the same depth together; a chain that has terminated rides along
masked out. The waste this costs is reported: ``info.n_leapfrog_steps`` per chain against
``info.n_leapfrog_computed`` for the batch. The loop over depths makes one host sync per doubling
(to stop once every chain has terminated); nothing else syncs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.errors import InputError
from ebm_samplers.state import GradientState, init_gradient_state
from ebm_samplers.base import DIVERGENCE_THRESHOLD, MCMCSampler
from ebm_samplers.tunables import ChainScalar, InverseMass, as_chain_scalar, as_inverse_mass, event_size, per_chain

__all__ = ["NUTSState", "NUTSInfo", "init", "step", "NUTSSampler"]


NUTSState = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""


@dataclass(frozen=True)
class NUTSInfo:
    """Per chain ``(n,)``: ``acceptance_prob`` (mean of ``min(1, e^{−ΔH})`` over the trajectory, the
    statistic step-size adaptation targets), ``divergent``, ``tree_depth``, ``n_leapfrog_steps``,
    ``hamiltonian`` (``H`` at the point drawn, for E-BFMI). Batch: ``n_leapfrog_computed`` (steps
    every chain paid for in lockstep), ``mean_trajectory_length``, ``max_trajectory_length``."""

    acceptance_prob: Tensor
    divergent: Tensor
    tree_depth: Tensor
    n_leapfrog_steps: Tensor
    hamiltonian: Tensor
    n_leapfrog_computed: int
    mean_trajectory_length: Tensor
    max_trajectory_length: Tensor

    @property
    def accepted(self) -> Tensor:
        """NUTS always moves to a draw from the trajectory; this is its mean acceptance statistic."""
        return self.acceptance_prob


init = init_gradient_state


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-chain inner product: ``(n, *event) × (n, *event) -> (n,)``."""
    return torch.linalg.vecdot(a.flatten(1), b.flatten(1))


def _is_turning(v_left: Tensor, v_right: Tensor, p_left: Tensor, p_right: Tensor, rho: Tensor) -> Tensor:
    """Generalised U-turn: ``rho`` (sum of momenta between the ends, ends halved) against both ends' velocities."""
    rho = torch.add(p_left, p_right).mul_(-0.5).add_(rho)
    return (_dot(v_left, rho) <= 0) | (_dot(v_right, rho) <= 0)


def _checkpoint_range(leaf: int) -> tuple[int, int]:
    """For leaf ``leaf`` of a subtree, the checkpoints whose sub-subtrees end here: ``[lo, hi]`` (empty if lo > hi)."""
    hi = bin(leaf >> 1).count("1")
    trailing_ones = 0
    n = leaf
    while n & 1:
        n >>= 1
        trailing_ones += 1
    return hi - trailing_ones + 1, hi


def _where(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)


def step(state: NUTSState, fns: EnergyFunctions, *, step_size: ChainScalar, max_tree_depth: int = 10,
         inv_mass: InverseMass | Tensor | None = None, temperature: ChainScalar = 1.0, jitter: float = 0.0,
         generator: torch.Generator | None = None) -> tuple[NUTSState, NUTSInfo]:
    """One NUTS transition of every chain. ``step_size``, ``temperature``: floats or ``(n_chains,)``;
    ``jitter`` draws each chain's step uniformly in ``[h(1 − jitter), h(1 + jitter)]`` this iteration."""
    x0 = state.x
    n = x0.shape[0]
    dev, acc = x0.device, torch.promote_types(x0.dtype, torch.float32)
    inv_mass = as_inverse_mass(inv_mass, x0)
    chain_shape = (n, *([1] * (x0.dim() - 1)))
    t = per_chain(temperature, x0)
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    h = per_chain(step_size, x0)
    h = h if isinstance(h, Tensor) else torch.full(chain_shape, h, dtype=x0.dtype, device=dev)
    if jitter:
        h = h * (1.0 + jitter * (2.0 * torch.rand(chain_shape, generator=generator, device=dev, dtype=x0.dtype) - 1.0))
    force = h / t

    p0 = inv_mass.momentum(torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=dev))
    cast = (lambda t: t.to(acc)) if acc != x0.dtype else (lambda t: t)
    inv_t = 1.0 / t_chain if isinstance(t_chain, float) else t_chain.reciprocal()
    h0 = cast(state.energy) * inv_t + cast(inv_mass.kinetic(p0))
    neg_inf = torch.full((n,), -math.inf, dtype=acc, device=dev)

    # the trajectory: its two ends, the sum of its momenta, its total log-weight, the chosen draw
    left_x, left_p, left_g = x0, p0, state.grad
    right_x, right_p, right_g = x0, p0, state.grad
    rho = p0.clone()
    log_w = torch.zeros(n, dtype=acc, device=dev)
    prop_x, prop_e, prop_g, prop_h = x0, state.energy, state.grad, h0
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    divergent = torch.zeros_like(done)
    depth = torch.zeros(n, dtype=torch.int64, device=dev)
    n_steps = torch.zeros(n, dtype=acc, device=dev)
    sum_accept = torch.zeros(n, dtype=acc, device=dev)
    computed = 0

    for j in range(max_tree_depth):
        forward = torch.rand(n, generator=generator, device=dev) < 0.5
        sign = torch.where(forward, 1.0, -1.0).to(x0.dtype).view(chain_shape)
        x = _where(forward, right_x, left_x)  # fresh tensors: updated in place below
        p = _where(forward, right_p, left_p)
        g = _where(forward, right_g, left_g)
        half_kick = 0.5 * sign * force
        drift = sign * h
        valid = ~done
        sub_log_w = neg_inf
        sub_rho = torch.zeros_like(p)
        sub_x, sub_e, sub_g, sub_h = prop_x, prop_e, prop_g, prop_h
        r_ckpt = torch.empty((max(j, 1), *p.shape), dtype=p.dtype, device=dev)
        rs_ckpt = torch.empty_like(r_ckpt)
        batched = 2**j * n <= 2**20  # draw this doubling's uniforms at once unless that is large
        uniforms = torch.rand((2**j, n), generator=generator, device=dev, dtype=acc).log_() if batched else None
        for leaf in range(2**j):
            p.addcmul_(half_kick, g, value=-1.0)
            x.addcmul_(drift, inv_mass.velocity(p))
            e, g = fns.energy_and_gradient(x)
            p.addcmul_(half_kick, g, value=-1.0)
            computed += 1
            # log-weight −ΔH of the leaf; NaN and ±inf energies become −inf (never chosen, divergent)
            if isinstance(inv_t, float):
                leaf_log_w = torch.add(cast(inv_mass.kinetic(p)), cast(e), alpha=inv_t).sub_(h0).neg_()
            else:
                leaf_log_w = torch.addcmul(cast(inv_mass.kinetic(p)), cast(e), inv_t).sub_(h0).neg_()
            leaf_log_w = leaf_log_w.nan_to_num_(nan=-math.inf, posinf=-math.inf)
            diverged = leaf_log_w < -DIVERGENCE_THRESHOLD
            active = valid.to(acc)
            sum_accept.addcmul_(leaf_log_w.clamp(max=0.0).exp_(), active)
            n_steps.add_(active)
            total = torch.logaddexp(sub_log_w, leaf_log_w)
            u = uniforms[leaf] if batched else torch.rand(n, generator=generator, device=dev, dtype=acc).log_()
            take = valid & (u < leaf_log_w - total)
            sub_x, sub_e, sub_g = _where(take, x, sub_x), torch.where(take, e, sub_e), _where(take, g, sub_g)
            sub_h = torch.where(take, h0 - leaf_log_w, sub_h)
            sub_log_w = torch.where(valid, total, sub_log_w)
            sub_rho.addcmul_(p, active.to(p.dtype).view(chain_shape))
            lo, hi = _checkpoint_range(leaf)
            if leaf % 2 == 0 and j > 0:
                r_ckpt[hi] = p
                rs_ckpt[hi] = sub_rho
            stop = diverged
            if lo <= hi:
                v = inv_mass.velocity(p)
                for i in range(hi, lo - 1, -1):
                    stop = stop | _is_turning(inv_mass.velocity(r_ckpt[i]), v, r_ckpt[i], p, sub_rho - rs_ckpt[i] + r_ckpt[i])
            divergent |= valid & diverged
            valid = valid & ~stop
        # merge the subtree into the trajectory where it stayed valid (biased progressive sampling)
        merge = valid
        take = merge & (torch.rand(n, generator=generator, device=dev, dtype=acc).log() < sub_log_w - log_w)
        prop_x, prop_e, prop_g = _where(take, sub_x, prop_x), torch.where(take, sub_e, prop_e), _where(take, sub_g, prop_g)
        prop_h = torch.where(take, sub_h, prop_h)
        log_w = torch.where(merge, torch.logaddexp(log_w, sub_log_w), log_w)
        rho = rho + _where(merge, sub_rho, 0.0)
        grow_right, grow_left = merge & forward, merge & ~forward
        right_x, right_p, right_g = _where(grow_right, x, right_x), _where(grow_right, p, right_p), _where(grow_right, g, right_g)
        left_x, left_p, left_g = _where(grow_left, x, left_x), _where(grow_left, p, left_p), _where(grow_left, g, left_g)
        depth = torch.where(merge, j + 1, depth)
        turning = _is_turning(inv_mass.velocity(left_p), inv_mass.velocity(right_p), left_p, right_p, rho)
        done = done | ~merge | turning
        if bool(done.all()):
            break

    new = NUTSState(prop_x, prop_e, prop_g)
    info = NUTSInfo(sum_accept / n_steps.clamp_min(1), divergent, depth, n_steps.to(torch.int64), prop_h, computed,
                    n_steps.mean(), n_steps.max())
    return new, info


class NUTSSampler(MCMCSampler):
    """NUTS over a batch of chains (multinomial, iterative, lockstep with per-chain masks).

    ``step_size`` defaults to ``0.5·d^(−1/4)``; ``max_tree_depth`` (default 10) caps a trajectory at
    ``2^max_tree_depth − 1`` leapfrog steps. ``jitter`` (e.g. 0.1) randomises each chain's step per
    iteration, which breaks the lockstep periodicity of the depth a batch needs.
    """

    name = "nuts"
    uses_noise_buffer = False
    compile_refusal = "its trajectories have a data-dependent length"

    def __init__(self, energy: EnergyModel, step_size: Any = None, *, max_tree_depth: int = 10, inv_mass: Any = None,
                 temperature: Any = 1.0, jitter: float = 0.0, **options: Any) -> None:
        super().__init__(energy, **options)
        self.step_size = step_size
        self.max_tree_depth = max_tree_depth
        self.inv_mass = inv_mass
        self.temperature = temperature
        self.jitter = jitter

    def default_step_size(self, x: Tensor) -> float:
        """``0.5·d^(−1/4)`` for ``x: (n_chains, *event_shape)`` with ``d`` elements per chain."""
        return 0.5 * event_size(x) ** (-0.25)

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts ``step_size`` (default :meth:`default_step_size`; float or ``(n_chains,)``), ``max_tree_depth``
        (int in [1, 20], default 10), ``inv_mass`` (default None: identity), ``temperature`` (default 1; float or
        ``(n_chains,)``) and ``jitter`` (in [0, 1), default 0)."""
        unknown = set(overrides) - {"step_size", "max_tree_depth", "inv_mass", "temperature", "jitter"}
        if unknown:
            raise InputError(f"NUTSSampler: unknown tunable(s) {sorted(unknown)}.")
        depth = overrides.get("max_tree_depth", self.max_tree_depth)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= 20:
            raise InputError(f"max_tree_depth must be an integer in [1, 20], got {depth!r}.")
        jitter = overrides.get("jitter", self.jitter)
        if not (isinstance(jitter, (int, float)) and 0 <= jitter < 1):
            raise InputError(f"jitter must be in [0, 1), got {jitter!r}.")
        step_size = overrides.get("step_size", self.step_size)
        return {
            "step_size": as_chain_scalar(self.default_step_size(x) if step_size is None else step_size, x, "step_size"),
            "max_tree_depth": depth,
            "inv_mass": as_inverse_mass(overrides.get("inv_mass", self.inv_mass), x),
            "temperature": as_chain_scalar(overrides.get("temperature", self.temperature), x, "temperature"),
            "jitter": float(jitter),
        }

    init_fn = staticmethod(init)
    step_fn = staticmethod(step)
