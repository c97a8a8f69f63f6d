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
(to stop once every chain has terminated); nothing else syncs. Where a kernel backend provides
``<energy>_nuts_chain`` (``ebm-cuda``, for analytic energies), :func:`build_chain` runs the same
algorithm as a fused chain instead: every chain its own trajectories, many iterations per launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebm_samplers.algorithm import (
    DIVERGENCE_THRESHOLD,
    Algorithm,
    Chain,
    ChainInfo,
    GradientState,
    Step,
    fused_chain,
    init_gradient_state,
    identity_mass_refusal,
)
from ebm_samplers.params import (
    ChainScalar,
    as_inverse_mass,
    checked,
    event_size,
    for_chains,
    in_range,
    optional,
    per_chain,
    positive,
    whole,
    with_fields,
)
from ebm_samplers.sampler import AlgorithmSampler

__all__ = [
    "State",
    "FusedState",
    "Info",
    "FusedInfo",
    "Params",
    "init",
    "energy_of",
    "build_kernel",
    "build_chain",
    "ALGORITHM",
    "NUTSSampler",
]

State = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""

init = init_gradient_state


@dataclass(frozen=True)
class Info:
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


@dataclass(frozen=True)
class Params:
    """``step_size`` (None: ``0.5·d^(−1/4)``; float or ``(n_chains,)``), ``max_tree_depth`` (in [1, 20]: at most
    ``2^max_tree_depth − 1`` leapfrog steps), ``inv_mass`` (as HMC's), ``temperature`` (float or ``(n_chains,)``) and
    ``jitter`` (in [0, 1): each chain's step drawn uniformly in ``[h(1 − jitter), h(1 + jitter)]`` per iteration, which
    breaks the lockstep periodicity of the depth a batch needs)."""

    step_size: ChainScalar | None = None
    max_tree_depth: int = 10
    inv_mass: Any = None
    temperature: ChainScalar = 1.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        checked(self, step_size=optional(positive), max_tree_depth=whole(1, 20), temperature=positive, jitter=in_range(0, 1))

    def resolve(self, x: Tensor) -> "Params":
        """These params for the states ``x``: the default step size filled, shapes checked, ``inv_mass`` prepared."""
        h = 0.5 * event_size(x) ** (-0.25) if self.step_size is None else self.step_size
        return with_fields(
            self,
            step_size=for_chains(h, x, "step_size"),
            inv_mass=as_inverse_mass(self.inv_mass, x),
            temperature=for_chains(self.temperature, x, "temperature"),
        )


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


def step(state: State, fns: EnergyFunctions, generator: torch.Generator | None, params: Params) -> tuple[State, Info]:
    """One NUTS transition of every chain with resolved ``params``."""
    x0 = state.x
    n = x0.shape[0]
    dev, acc = x0.device, torch.promote_types(x0.dtype, torch.float32)
    inv_mass, temperature, step_size, jitter = params.inv_mass, params.temperature, params.step_size, params.jitter
    max_tree_depth = params.max_tree_depth
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

    new = State(prop_x, prop_e, prop_g)
    info = Info(
        sum_accept / n_steps.clamp_min(1),
        divergent,
        depth,
        n_steps.to(torch.int64),
        prop_h,
        computed,
        n_steps.mean(),
        n_steps.max(),
    )
    return new, info


def build_kernel() -> Step:
    """:func:`step`: NUTS draws a data-dependent number of random values, straight from ``generator``."""
    return step


@dataclass(frozen=True)
class FusedState:
    """The state after a fused run: the positions ``x: (n, *event_shape)`` only. The kernel keeps energies and
    gradients to itself and a fused run continues from ``x``, so they are not recomputed after each call (W8, 200
    one-iteration calls while a trajectory is kept: 3 ms of 34); :func:`energy_of` evaluates ``E`` where diagnostics
    ask for it."""

    x: Tensor


def energy_of(state: State | FusedState, fns: EnergyFunctions) -> Tensor:
    """``E`` at the state's positions: carried by a per-step state, evaluated for a fused run's."""
    return state.energy if isinstance(state, GradientState) else fns.energy(state.x)


@dataclass(frozen=True)
class FusedInfo(ChainInfo):
    """What a fused NUTS run of ``n`` iterations reports per chain ``(n_chains,)``, each summed over them:
    ``accepted`` (the acceptance statistic, float), ``divergent``, ``n_leapfrog_steps`` and ``tree_depth``."""

    n_leapfrog_steps: Tensor
    tree_depth: Tensor


def build_chain(energy: EnergyModel, fns: EnergyFunctions, x: Tensor, params: Params, fused_setting: bool | None) -> Chain | str:
    """Many iterations per launch with the ``<energy>_nuts_chain`` kernel (identity mass, one temperature for all
    chains, no jitter), each chain building its own trees."""
    refusal = identity_mass_refusal(params)
    if refusal:
        return refusal
    if params.jitter:
        return f"jitter={params.jitter} is set, the fused chain takes a fixed step size"
    chain = fused_chain("nuts_chain", energy, fns.program, x, fused_setting)
    if isinstance(chain, str):
        return chain
    h, depth, beta = params.step_size, params.max_tree_depth, 1.0 / params.temperature

    def run(state: State | FusedState, n: int, seed: int, offset: int) -> tuple[FusedState, FusedInfo]:
        x_new, accepted, divergent, n_leapfrog, tree_depth = chain(
            state.x, n_steps=n, step_size=h, max_tree_depth=depth, inverse_temperature=beta, seed=seed, offset=offset
        )
        return FusedState(x_new), FusedInfo(accepted, divergent, n_leapfrog, tree_depth)

    return run


ALGORITHM = Algorithm(
    "nuts",
    Params,
    init,
    build_kernel,
    has_acceptance=True,
    build_chain=build_chain,
    energy_of=energy_of,
    compile_refusal="its trajectories have a data-dependent length",
    graph_refusal="its trees stop growing when every chain's has, a host sync per doubling",
)


class NUTSSampler(AlgorithmSampler):
    """NUTS (multinomial, iterative, lockstep with per-chain masks): ``NUTSSampler(energy, step_size=None, *,
    max_tree_depth=10, inv_mass=None, temperature=1.0, jitter=0.0, autocast=None, fused=None)``; the params are
    :class:`Params`'. ``fused``: as every sampler's (a fused chain runs each chain's trees on their own)."""

    algorithm = ALGORITHM
