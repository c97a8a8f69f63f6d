"""Hamiltonian Monte Carlo: momentum ``p ~ N(0, M)``, ``n_leapfrog_steps`` steps of a symplectic
integrator on ``H = E(x)/T + ½pᵀM⁻¹p``, then a Metropolis test on ``ΔH``.

The state carries ``E(x)`` and ``∇E(x)``, so a trajectory of ``L`` leapfrog steps costs ``L``
gradient evaluations (``L + 1`` counting the one carried in). A proposal with non-finite ``ΔH`` or
``ΔH > 1000`` is rejected and counted as divergent.
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
    compiled,
    draw_then,
    init_gradient_state,
    identity_mass_refusal,
)
from ebm_samplers.integrators import Leapfrog, SplittingIntegrator, resolve_integrator
from ebm_samplers.params import (
    ChainScalar,
    as_inverse_mass,
    checked,
    event_size,
    for_chains,
    optional,
    per_chain,
    positive,
    whole,
    with_fields,
)
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["State", "Info", "Params", "init", "transition", "build_kernel", "ALGORITHM", "HMCSampler"]

State = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""

init = init_gradient_state


@dataclass(frozen=True)
class Info:
    """Per chain ``(n,)``: ``accepted``, ``acceptance_prob``, ``divergent``, ``energy_change`` (``ΔH``),
    ``hamiltonian`` (``H`` of the state kept, for E-BFMI); ``n_gradient_evaluations``: per chain in this step."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor
    energy_change: Tensor
    hamiltonian: Tensor
    n_gradient_evaluations: int


@dataclass(frozen=True)
class Params:
    """``step_size`` (None: ``0.5·d^(−1/4)``; float or ``(n_chains,)``), ``n_leapfrog_steps`` (None: ``⌈√d⌉``),
    ``inv_mass`` (None: identity; diagonal ``event_shape`` or ``(n_chains, *event_shape)``, dense ``(d, d)``, or an
    :class:`~ebm_samplers.InverseMass`) and ``temperature`` (float or ``(n_chains,)``)."""

    step_size: ChainScalar | None = None
    n_leapfrog_steps: int | None = None
    inv_mass: Any = None
    temperature: ChainScalar = 1.0

    def __post_init__(self) -> None:
        checked(self, step_size=optional(positive), n_leapfrog_steps=optional(whole(1)), temperature=positive)

    def resolve(self, x: Tensor) -> "Params":
        """These params for the states ``x``: defaults for ``d = event_size(x)`` filled, shapes checked, ``inv_mass`` prepared."""
        d = event_size(x)
        return with_fields(
            self,
            step_size=for_chains(0.5 * d ** (-0.25) if self.step_size is None else self.step_size, x, "step_size"),
            n_leapfrog_steps=max(1, math.ceil(math.sqrt(d))) if self.n_leapfrog_steps is None else self.n_leapfrog_steps,
            inv_mass=as_inverse_mass(self.inv_mass, x),
            temperature=for_chains(self.temperature, x, "temperature"),
        )


def transition(
    state: State, noise: Tensor, uniform: Tensor, fns: EnergyFunctions, params: Params, integrator: SplittingIntegrator
) -> tuple[State, Info]:
    """One HMC step given standard normal ``noise`` (like ``x``; it is overwritten) and ``uniform ~ U[0, 1)``: ``(n,)``.

    A non-finite gradient anywhere on the trajectory makes the final momentum, hence ``ΔH``,
    non-finite, so one finiteness test on ``ΔH`` covers positions, energies and gradients.
    """
    x0, inv_mass = state.x, params.inv_mass
    acc = uniform.dtype
    t = per_chain(params.temperature, x0)
    p = inv_mass.momentum(noise)
    kinetic0 = inv_mass.kinetic(p).to(acc)
    x, p, energy, grad = integrator.integrate(
        x0.clone(), p, state.grad, fns, per_chain(params.step_size, x0), params.n_leapfrog_steps, inv_mass, 1.0 / t
    )
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    h0 = state.energy.to(acc) / t_chain + kinetic0
    delta = energy.to(acc) / t_chain + inv_mass.kinetic(p).to(acc) - h0
    finite = torch.isfinite(delta)
    prob = torch.where(finite, delta.neg().clamp_(max=0.0).exp_(), torch.zeros_like(delta))
    accepted = uniform < prob
    mask = accepted.view(-1, *([1] * (x0.dim() - 1)))
    new = State(torch.where(mask, x, x0), torch.where(accepted, energy, state.energy), torch.where(mask, grad, state.grad))
    divergent = ~finite | (delta > DIVERGENCE_THRESHOLD)
    evaluations = params.n_leapfrog_steps * integrator.gradient_evaluations_per_step
    return new, Info(accepted, prob, divergent, delta, torch.where(accepted, h0 + delta, h0), evaluations)


def options(energy: EnergyModel, integrator: Any = None) -> dict[str, Any]:
    """``integrator``: a symplectic ``hamiltonian`` integrator or a registered name (default leapfrog)."""
    if integrator is None:
        return {"integrator": Leapfrog()}
    return {"integrator": resolve_integrator(integrator, kind="hamiltonian", symplectic=True, user="HMCSampler")}


def build_kernel(integrator: SplittingIntegrator | None = None, compile: bool = False) -> Step:
    """``step(state, fns, generator, params)``: draws ``ξ`` then ``u`` into kept buffers, then :func:`transition`
    (through ``torch.compile`` with ``compile``) with ``integrator`` (default leapfrog)."""
    integrator = integrator or Leapfrog()
    return draw_then(compiled(transition) if compile else transition, uniform=True, bind=lambda x: (integrator,))


def fused_hmc_chain(
    energy: EnergyModel, fns: EnergyFunctions, x: Tensor, params: Any, fused_setting: bool | None, integrator: Any
) -> Any:
    """The energy's ``<op>_hmc_chain`` kernel for ``params`` (HMC's and ChEES's fused chains), or why it cannot run:
    the integrator must be leapfrog and the mass the identity."""
    if not isinstance(integrator, Leapfrog):
        return f"the integrator is {integrator.name}, the fused chain is leapfrog"
    refusal = identity_mass_refusal(params)
    if refusal:
        return refusal
    return fused_chain("hmc_chain", energy, fns.program, x, fused_setting)


def build_chain(
    energy: EnergyModel,
    fns: EnergyFunctions,
    x: Tensor,
    params: Params,
    fused_setting: bool | None,
    integrator: SplittingIntegrator,
) -> Chain | str:
    """Many transitions per launch with the ``<energy>_hmc_chain`` kernel (leapfrog, identity mass, one
    temperature for all chains)."""
    chain = fused_hmc_chain(energy, fns, x, params, fused_setting, integrator)
    if isinstance(chain, str):
        return chain
    h, n_leapfrog, beta = params.step_size, params.n_leapfrog_steps, 1.0 / params.temperature

    def run(state: State, n: int, seed: int, offset: int) -> tuple[State, ChainInfo]:
        x_new, accepted, divergent = chain(
            state.x, n_steps=n, step_size=h, n_leapfrog_steps=n_leapfrog, inverse_temperature=beta, seed=seed, offset=offset
        )
        energy_new, grad = fns.energy_and_gradient(x_new)
        return State(x_new, energy_new, grad), ChainInfo(accepted, divergent)

    return run


ALGORITHM = Algorithm("hmc", Params, init, build_kernel, has_acceptance=True, options=options, build_chain=build_chain)


class HMCSampler(AlgorithmSampler):
    """HMC: ``HMCSampler(energy, step_size=None, n_leapfrog_steps=None, *, inv_mass=None, temperature=1.0,
    integrator=None, autocast=None, compile=False, fused=None)``; defaults for unit-scale targets (:class:`Params`).
    ``integrator``: a registered symplectic ``hamiltonian`` integrator (``leapfrog``, ``mclachlan``, ``yoshida``)."""

    algorithm = ALGORITHM
    positional = ("step_size", "n_leapfrog_steps")
