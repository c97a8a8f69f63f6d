"""Generalized HMC (Horowitz 1991), the transition of MEADS (Hoffman & Sountsov 2022, "Tuning-Free Generalized
Hamiltonian Monte Carlo"): one leapfrog step per iteration, with the momentum kept from one iteration to the next and
only partly refreshed.

The momentum is kept whitened, ``ρ ~ N(0, I)`` like ``x`` (the actual momentum is ``p = M^½·ρ``, the velocity
``M⁻¹p = σ∘ρ`` for the diagonal ``M⁻¹ = diag(σ²)``), so the joint target ``π(x)·N(ρ; 0, I)`` is the same whatever the
metric: an adaptation may change ``M`` between iterations. Iteration ``k``, per chain:

1. **Partial refreshment**: ``ρ ← √(1 − α)·ρ + √α·ξ``, ``ξ ~ N(0, I)``, with ``α = 1 − exp(−2·h·γ)`` from the step
   size ``h`` and the damping ``γ`` (``γ → ∞``: a full refresh, HMC with one leapfrog step, i.e. MALA; ``γ → 0``: the
   momentum persists, long trajectories pieced together from single steps).
2. **One step** of a symplectic integrator (leapfrog by default) from ``(x, ρ)`` to ``(x', ρ')``, and
   ``ΔH = E(x')/T + ½‖ρ'‖² − E(x)/T − ½‖ρ‖²``.
3. **The accept test**. With ``nonreversible=True`` (the default, Neal 2020, as the paper): a slice variable
   ``u ∈ [−1, 1)`` kept in the state moves by ``u ← ((u + 1 + δ) mod 2) − 1`` (``δ = slice_shift``, default
   ``α/2``), the step is accepted when ``|u| < exp(−ΔH)``, and then ``u ← u·exp(ΔH)``. Rejections, which reverse the
   momentum, then come in runs instead of at random, so the chain retraces its path less often. With
   ``nonreversible=False``: a fresh ``U ~ U[0, 1)`` against ``min(1, exp(−ΔH))`` (plain GHMC).
4. Accepted: ``(x', ρ')``; rejected: ``(x, −ρ)``, the momentum reversed. A proposal with non-finite ``ΔH`` or
   ``ΔH > 1000`` is rejected and counted as divergent.

:func:`init` cannot draw (it has no generator): its state marks every chain ``fresh``, and the first step draws the
momentum in full (``α = 1``) and ``u ~ U[−1, 1)``. :func:`~ebm_samplers.meads_adaptation.meads_warmup` sets ``h``,
``γ`` and ``σ`` per chain from the other chains' states at every iteration; sampling then runs this kernel with them
frozen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.errors import InputError
from ebm_samplers.algorithm import DIVERGENCE_THRESHOLD, Algorithm, Step, compiled, draw_then
from ebm_samplers.integrators import Leapfrog, SplittingIntegrator, resolve_integrator
from ebm_samplers.params import (
    ChainScalar,
    InverseMass,
    as_inverse_mass,
    checked,
    event_size,
    for_chains,
    optional,
    positive,
    with_fields,
)
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["State", "Info", "Params", "init", "transition", "build_kernel", "ALGORITHM", "MEADSSampler"]


@dataclass(frozen=True)
class State:
    """``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``; ``momentum``: the whitened
    momentum ``ρ`` like ``x``; ``slice``: the slice variable ``u ∈ [−1, 1)``, ``(n,)`` (in at least float32);
    ``fresh``: ``(n,)`` bool, the chains whose ``ρ`` and ``u`` the next step draws in full (all, after :func:`init`)."""

    x: Tensor
    energy: Tensor
    grad: Tensor
    momentum: Tensor
    slice: Tensor
    fresh: Tensor


@dataclass(frozen=True)
class Info:
    """Per chain ``(n,)``: ``accepted``, ``acceptance_prob`` (``min(1, exp(−ΔH))``), ``divergent``, ``energy_change``
    (``ΔH``); ``n_gradient_evaluations``: per chain in this step. No ``hamiltonian``: E-BFMI, which a run computes
    from it, assumes a momentum drawn afresh at every iteration, and GHMC keeps most of it (a low E-BFMI here would be
    by design, not a warning sign)."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor
    energy_change: Tensor
    n_gradient_evaluations: int


def _shift(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InputError(f"{name} must be a number in (0, 1] or None (α/2), got {value!r}.")
    return float(value)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, got {value!r}.")
    return value


def _diagonal(value: Any, x: Tensor) -> InverseMass:
    """``inv_mass`` for ``x``: the identity or a diagonal ``diag(σ²)`` (``event_shape`` or ``(n_chains, *event_shape)``)."""
    metric = as_inverse_mass(value, x)
    if metric.kind not in ("identity", "diagonal"):
        raise InputError(
            f"MEADSSampler takes a diagonal inv_mass (event_shape or (n_chains, *event_shape)), got a {metric.kind} one: "
            "the momentum is kept whitened by the per-coordinate scales σ, M⁻¹ = diag(σ²)."
        )
    return metric


@dataclass(frozen=True)
class Params:
    """``step_size`` ``h`` (None: ``0.5·d^(−1/4)``; float or ``(n_chains,)``), ``damping`` ``γ > 0`` (float or
    ``(n_chains,)``; the momentum keeps ``√(1 − α)`` of itself per step, ``α = 1 − exp(−2hγ)``), ``slice_shift``
    ``δ`` in ``(0, 1]`` (None: ``α/2``, per chain), ``nonreversible`` (the slice-variable accept test, else plain
    GHMC), ``inv_mass`` (None: identity; diagonal ``diag(σ²)`` of shape ``event_shape`` or
    ``(n_chains, *event_shape)``) and ``temperature`` (float or ``(n_chains,)``)."""

    step_size: ChainScalar | None = None
    damping: ChainScalar = 1.0
    slice_shift: float | None = None
    nonreversible: bool = True
    inv_mass: Any = None
    temperature: ChainScalar = 1.0

    def __post_init__(self) -> None:
        checked(
            self,
            step_size=optional(positive),
            damping=positive,
            slice_shift=optional(_shift),
            nonreversible=_flag,
            temperature=positive,
        )

    def resolve(self, x: Tensor) -> "Params":
        """These params for the states ``x``: the default step size for ``d = event_size(x)``, shapes checked,
        ``inv_mass`` prepared (identity or diagonal)."""
        d = event_size(x)
        return with_fields(
            self,
            step_size=for_chains(0.5 * d ** (-0.25) if self.step_size is None else self.step_size, x, "step_size"),
            damping=for_chains(self.damping, x, "damping"),
            inv_mass=_diagonal(self.inv_mass, x),
            temperature=for_chains(self.temperature, x, "temperature"),
        )


def init(x: Tensor, fns: EnergyFunctions) -> State:
    """The state at ``x`` (one energy-and-gradient evaluation); every chain ``fresh``, so the first step draws its
    momentum and slice variable."""
    energy, grad = fns.energy_and_gradient(x)
    n = x.shape[0]
    u = torch.zeros(n, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    return State(x, energy, grad, torch.zeros_like(x), u, torch.ones(n, dtype=torch.bool, device=x.device))


def _vector(value: ChainScalar, x: Tensor) -> Tensor:
    """A per-chain parameter as ``(n,)`` in ``x``'s dtype."""
    if isinstance(value, Tensor):
        return value.reshape(-1)
    return torch.full((x.shape[0],), value, dtype=x.dtype, device=x.device)


def _whiten(inv_mass: InverseMass, p: Tensor) -> Tensor:
    """``ρ = M^(−½)·p`` (identity or diagonal metric)."""
    return p if inv_mass.kind == "identity" else p / inv_mass.mass_sqrt


def transition(
    state: State, noise: Tensor, uniform: Tensor, fns: EnergyFunctions, params: Params, integrator: SplittingIntegrator
) -> tuple[State, Info]:
    """One GHMC step (module docstring) given standard normal ``noise`` (like ``x``; overwritten) and
    ``uniform ~ U[0, 1)``: ``(n,)`` (the accept draw of plain GHMC, and ``u`` of fresh chains). A non-finite gradient
    makes ``ΔH`` non-finite, so one test on ``ΔH`` covers positions, energies and gradients."""
    x0, inv_mass = state.x, params.inv_mass
    acc = uniform.dtype
    shape = (-1, *([1] * (x0.dim() - 1)))
    h = _vector(params.step_size, x0)
    alpha = torch.where(state.fresh, 1.0, torch.expm1(-2.0 * h * _vector(params.damping, x0)).neg_())
    rho = noise.mul_(alpha.sqrt().view(shape)).add_(state.momentum * (1.0 - alpha).sqrt().view(shape))
    p = inv_mass.momentum(rho)
    p = p.clone() if p is rho else p  # the integrator works in place; ρ is kept for a rejection
    t = params.temperature
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    beta = 1.0 / t if isinstance(t, float) else 1.0 / t.view(shape)
    x, p, energy, grad = integrator.integrate(x0.clone(), p, state.grad, fns, h.view(shape), 1, inv_mass, beta)
    rho1 = _whiten(inv_mass, p)
    h0 = state.energy.to(acc) / t_chain + 0.5 * rho.flatten(1).square().sum(1).to(acc)
    delta = energy.to(acc) / t_chain + 0.5 * rho1.flatten(1).square().sum(1).to(acc) - h0
    finite = torch.isfinite(delta)
    prob = torch.where(finite, delta.neg().clamp_(max=0.0).exp_(), torch.zeros_like(delta))
    if params.nonreversible:
        shift = (alpha / 2 if params.slice_shift is None else torch.full_like(alpha, params.slice_shift)).to(acc)
        u = torch.where(state.fresh, 2.0 * uniform - 1.0, torch.remainder(state.slice + 1.0 + shift, 2.0) - 1.0)
        accepted = finite & (u.abs() < prob)
        u = torch.where(accepted, u * delta.exp(), u)  # |u·e^ΔH| < 1 where accepted: u stays uniform
    else:
        accepted = uniform < prob
        u = state.slice
    mask = accepted.view(shape)
    new = State(
        torch.where(mask, x, x0),
        torch.where(accepted, energy, state.energy),
        torch.where(mask, grad, state.grad),
        torch.where(mask, rho1, rho.neg()),
        u,
        torch.zeros_like(state.fresh),
    )
    divergent = ~finite | (delta > DIVERGENCE_THRESHOLD)
    return new, Info(accepted, prob, divergent, delta, integrator.gradient_evaluations_per_step)


def options(energy: EnergyModel, integrator: Any = None) -> dict[str, Any]:
    """``integrator``: a symplectic ``hamiltonian`` integrator or a registered name (default leapfrog); one of its
    steps per iteration."""
    if integrator is None:
        return {"integrator": Leapfrog()}
    return {"integrator": resolve_integrator(integrator, kind="hamiltonian", symplectic=True, user="MEADSSampler")}


def build_kernel(integrator: SplittingIntegrator | None = None, compile: bool = False) -> Step:
    """``step(state, fns, generator, params)``: draws ``ξ`` then ``U`` into kept buffers, then :func:`transition`
    (through ``torch.compile`` with ``compile``) with ``integrator`` (default leapfrog)."""
    integrator = integrator or Leapfrog()
    return draw_then(compiled(transition) if compile else transition, uniform=True, bind=lambda x: (integrator,))


def _warmup(sampler: Any, x0: Tensor, n_warmup: int, *, target_accept: float, generator: Any = None) -> Any:
    """The algorithm's own warm-up, for ``ebm sample``: :func:`~ebm_samplers.meads_adaptation.meads_warmup`
    (``target_accept`` is not used: MEADS sets its step size from curvature, not from an acceptance target)."""
    from ebm_samplers.meads_adaptation import meads_warmup  # it imports this module

    return meads_warmup(sampler, x0, n_warmup, generator=generator)


ALGORITHM = Algorithm(
    "meads",
    Params,
    init,
    build_kernel,
    has_acceptance=True,
    options=options,
    warmup=_warmup,
    warmup_adapts="its step size, damping and diagonal mass from the other folds' states, with no acceptance target",
)


class MEADSSampler(AlgorithmSampler):
    """Generalized HMC with MEADS-adapted tunables: ``MEADSSampler(energy, step_size=None, damping=1.0, *,
    slice_shift=None, nonreversible=True, inv_mass=None, temperature=1.0, integrator=None, compile=False)``
    (:class:`Params`). Tune ``step_size``, ``damping`` and a diagonal ``inv_mass`` with
    :func:`~ebm_samplers.meads_adaptation.meads_warmup`."""

    algorithm = ALGORITHM
    positional = ("step_size", "damping")
