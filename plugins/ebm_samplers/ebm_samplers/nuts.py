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
    InverseMass,
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


def _dot(a: Tensor, b: Tensor, product: Tensor) -> Tensor:
    """Per-chain inner product: ``(n, *event) × (n, *event) -> (n,)``. ``torch.linalg.vecdot`` on the CPU is
    ``(a·b).sum(-1)`` with a state-sized temporary for the product; this writes it into ``product: (n, d)`` and sums
    the same way (the same values), where the product keeps ``product``'s dtype."""
    a, b = a.flatten(1), b.flatten(1)
    if torch.result_type(a, b) != product.dtype:
        return torch.linalg.vecdot(a, b)
    return torch.mul(a, b, out=product).sum(-1)


def _is_turning(
    v_left: Tensor, v_right: Tensor, p_left: Tensor, p_right: Tensor, rho: Tensor, out: Tensor, product: Tensor
) -> Tensor:
    """Generalised U-turn: ``rho`` (sum of momenta between the ends, ends halved) against both ends' velocities;
    ``out`` (not ``rho``) and ``product``: state-sized scratch buffers."""
    rho = torch.add(p_left, p_right, out=out).mul_(-0.5).add_(rho)
    return (_dot(v_left, rho, product) <= 0) | (_dot(v_right, rho, product) <= 0)


def _checkpoint_range(leaf: int) -> tuple[int, int]:
    """For leaf ``leaf`` of a subtree, the checkpoints whose sub-subtrees end here: ``[lo, hi]`` (empty if lo > hi)."""
    hi = bin(leaf >> 1).count("1")
    trailing_ones = 0
    n = leaf
    while n & 1:
        n >>= 1
        trailing_ones += 1
    return hi - trailing_ones + 1, hi


def _where(mask: Tensor, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """Per chain ``a`` where ``mask`` else ``b``; into ``out`` (which may be ``b``) where given."""
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b, out=out)


def _velocity(inv_mass: InverseMass, p: Tensor, out: Tensor | None) -> Tensor:
    """``M⁻¹ p``: ``p`` itself for the identity, into the scratch ``out`` where given (a diagonal mass whose product
    keeps ``p``'s shape and dtype, :func:`_velocity_buffers`), else ``inv_mass.velocity(p)``; the same values."""
    if inv_mass.kind == "identity":
        return p
    return inv_mass.velocity(p) if out is None else torch.mul(p, inv_mass.values, out=out)


def _velocity_buffers(inv_mass: InverseMass, p: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Two scratch buffers for :func:`_velocity` where a diagonal mass's product can be written into one (None:
    the identity needs none, a dense or low-rank product allocates its own)."""
    if inv_mass.kind != "diagonal" or torch.broadcast_shapes(p.shape, inv_mass.values.shape) != p.shape:
        return None, None
    if torch.result_type(p, inv_mass.values) != p.dtype:
        return None, None
    return torch.empty_like(p), torch.empty_like(p)


def step(state: State, fns: EnergyFunctions, generator: torch.Generator | None, params: Params) -> tuple[State, Info]:
    """One NUTS transition of every chain with resolved ``params``.

    Outside the energy, a leaf allocates nothing of a state's size: the trajectory's ends, the subtree's draw, the
    momentum sums, the checkpoints and the U-turn arithmetic live in buffers made once per transition and written in
    place (``out=``). At 10,000 chains × d = 1,000 (40 MB states, above glibc's 32 MiB ``mmap`` threshold, so every
    allocation maps and zeroes fresh pages) the per-leaf temporaries made each leaf cost more in page faults than the
    arithmetic (issue 40; ``docs/samplers.md``, NUTS)."""
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

    # the trajectory: its two ends (owned buffers, updated in place), the sum of its momenta, its total log-weight,
    # the chosen draw (the caller's tensors until a merge first takes a subtree's draw, then owned)
    left_x, left_p, left_g = x0.clone(), p0.clone(), state.grad.clone()
    right_x, right_p, right_g = x0.clone(), p0, state.grad.clone()
    rho = p0.clone()
    log_w = torch.zeros(n, dtype=acc, device=dev)
    prop_x, prop_e, prop_g, prop_h = x0, state.energy, state.grad, h0
    prop_owned = False
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    divergent = torch.zeros_like(done)
    depth = torch.zeros(n, dtype=torch.int64, device=dev)
    n_steps = torch.zeros(n, dtype=acc, device=dev)
    sum_accept = torch.zeros(n, dtype=acc, device=dev)
    computed = 0
    # the subtree's buffers: the leapfrog position and momentum, its draw and its momentum sum. The draw's value
    # before a chain's first leaf is never read (a chain valid at its first leaf always takes it), so ``sub_g``
    # holds the gradient the subtree starts from until then.
    x, p = torch.empty_like(x0), torch.empty_like(p0)
    sub_x, sub_g, sub_rho = torch.empty_like(x0), torch.empty_like(state.grad), torch.empty_like(p0)
    scratch = torch.empty_like(p0)  # U-turn arithmetic
    product = torch.empty((n, math.prod(p0.shape[1:])), dtype=p0.dtype, device=dev)  # inner products (:func:`_dot`), and
    sub_rho_i = product.view(p0.shape)  # a checkpoint's momentum sum, read before an inner product writes ``product``
    v_buf, v_ckpt_buf = _velocity_buffers(inv_mass, p0)
    r_ckpt: list[Tensor] = []  # checkpoint i: the momentum and the momentum sum at the start of a sub-subtree
    rs_ckpt: list[Tensor] = []

    for j in range(max_tree_depth):
        forward = torch.rand(n, generator=generator, device=dev) < 0.5
        sign = torch.where(forward, 1.0, -1.0).to(x0.dtype).view(chain_shape)
        _where(forward, right_x, left_x, out=x)
        _where(forward, right_p, left_p, out=p)
        g = _where(forward, right_g, left_g, out=sub_g)
        half_kick = 0.5 * sign * force
        drift = sign * h
        valid = ~done
        sub_log_w = neg_inf
        sub_rho.zero_()
        sub_e, sub_h = prop_e, prop_h
        while len(r_ckpt) < j:
            r_ckpt.append(torch.empty_like(p0))
            rs_ckpt.append(torch.empty_like(p0))
        batched = 2**j * n <= 2**20  # draw this doubling's uniforms at once unless that is large
        uniforms = torch.rand((2**j, n), generator=generator, device=dev, dtype=acc).log_() if batched else None
        for leaf in range(2**j):
            p.addcmul_(half_kick, g, value=-1.0)
            x.addcmul_(drift, _velocity(inv_mass, p, v_buf))
            g = None  # the last leaf's gradient is spent: its memory is free for the energy's temporaries
            e, g = fns.energy_and_gradient(x)
            p.addcmul_(half_kick, g, value=-1.0)
            computed += 1
            v = _velocity(inv_mass, p, v_buf)
            kinetic = _dot(p, v, product).mul_(0.5)  # inv_mass.kinetic(p)
            # log-weight −ΔH of the leaf; NaN and ±inf energies become −inf (never chosen, divergent)
            if isinstance(inv_t, float):
                leaf_log_w = torch.add(cast(kinetic), cast(e), alpha=inv_t).sub_(h0).neg_()
            else:
                leaf_log_w = torch.addcmul(cast(kinetic), cast(e), inv_t).sub_(h0).neg_()
            leaf_log_w = leaf_log_w.nan_to_num_(nan=-math.inf, posinf=-math.inf)
            diverged = leaf_log_w < -DIVERGENCE_THRESHOLD
            active = valid.to(acc)
            sum_accept.addcmul_(leaf_log_w.clamp(max=0.0).exp_(), active)
            n_steps.add_(active)
            total = torch.logaddexp(sub_log_w, leaf_log_w)
            u = uniforms[leaf] if batched else torch.rand(n, generator=generator, device=dev, dtype=acc).log_()
            take = valid & (u < leaf_log_w - total)
            _where(take, x, sub_x, out=sub_x)
            _where(take, g, sub_g, out=sub_g)
            sub_e = torch.where(take, e, sub_e)
            sub_h = torch.where(take, h0 - leaf_log_w, sub_h)
            sub_log_w = torch.where(valid, total, sub_log_w)
            sub_rho.addcmul_(p, active.to(p.dtype).view(chain_shape))
            lo, hi = _checkpoint_range(leaf)
            if leaf % 2 == 0 and j > 0:
                r_ckpt[hi].copy_(p)
                rs_ckpt[hi].copy_(sub_rho)
            stop = diverged
            for i in range(hi, lo - 1, -1):
                torch.sub(sub_rho, rs_ckpt[i], out=sub_rho_i).add_(r_ckpt[i])
                v_i = _velocity(inv_mass, r_ckpt[i], v_ckpt_buf)
                stop = stop | _is_turning(v_i, v, r_ckpt[i], p, sub_rho_i, scratch, product)
            divergent |= valid & diverged
            valid = valid & ~stop
        # merge the subtree into the trajectory where it stayed valid (biased progressive sampling)
        merge = valid
        take = merge & (torch.rand(n, generator=generator, device=dev, dtype=acc).log() < sub_log_w - log_w)
        prop_x = _where(take, sub_x, prop_x, out=prop_x if prop_owned else None)
        prop_g = _where(take, sub_g, prop_g, out=prop_g if prop_owned else None)
        prop_owned = True
        prop_e = torch.where(take, sub_e, prop_e)
        prop_h = torch.where(take, sub_h, prop_h)
        log_w = torch.where(merge, torch.logaddexp(log_w, sub_log_w), log_w)
        rho.add_(scratch.copy_(sub_rho).masked_fill_(~merge.view(chain_shape), 0.0))
        grow_right, grow_left = merge & forward, merge & ~forward
        for mask, end, new in ((grow_right, right_x, x), (grow_right, right_p, p), (grow_right, right_g, g)):
            _where(mask, new, end, out=end)
        for mask, end, new in ((grow_left, left_x, x), (grow_left, left_p, p), (grow_left, left_g, g)):
            _where(mask, new, end, out=end)
        depth = torch.where(merge, j + 1, depth)
        v_left, v_right = _velocity(inv_mass, left_p, v_buf), _velocity(inv_mass, right_p, v_ckpt_buf)
        turning = _is_turning(v_left, v_right, left_p, right_p, rho, scratch, product)
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
