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
from ebmcore.errors import InputError
from ebm_samplers.state import GradientState, init_gradient_state
from ebm_samplers.base import DIVERGENCE_THRESHOLD, FusedRunner, MCMCSampler
from ebm_samplers.integrators import Leapfrog, SplittingIntegrator, resolve_integrator
from ebm_samplers.tunables import IDENTITY, ChainScalar, InverseMass, as_chain_scalar, as_inverse_mass, event_size, per_chain

__all__ = ["HMCState", "HMCInfo", "init", "step", "transition", "HMCSampler", "DIVERGENCE_THRESHOLD"]

_LEAPFROG = Leapfrog()


HMCState = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""


@dataclass(frozen=True)
class HMCInfo:
    """Per chain ``(n,)``: ``accepted``, ``acceptance_prob``, ``divergent``, ``energy_change`` (``ΔH``),
    ``hamiltonian`` (``H`` of the state kept, for E-BFMI); ``n_gradient_evaluations``: per chain in this step."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor
    energy_change: Tensor
    hamiltonian: Tensor
    n_gradient_evaluations: int


init = init_gradient_state


def transition(state: HMCState, noise: Tensor, uniform: Tensor, fns: EnergyFunctions, *, step_size: ChainScalar,
               n_leapfrog_steps: int, inv_mass: InverseMass = IDENTITY, temperature: ChainScalar = 1.0,
               integrator: SplittingIntegrator = _LEAPFROG) -> tuple[HMCState, HMCInfo]:
    """One HMC step given standard normal ``noise`` (like ``x``; it is overwritten) and ``uniform ~ U[0, 1)``: ``(n,)``.

    A non-finite gradient anywhere on the trajectory makes the final momentum, hence ``ΔH``,
    non-finite, so one finiteness test on ``ΔH`` covers positions, energies and gradients.
    """
    x0 = state.x
    acc = uniform.dtype
    t = per_chain(temperature, x0)
    p = inv_mass.momentum(noise)
    kinetic0 = inv_mass.kinetic(p).to(acc)
    x, p, energy, grad = integrator.integrate(x0.clone(), p, state.grad, fns, per_chain(step_size, x0),
                                              n_leapfrog_steps, inv_mass, 1.0 / t)
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    h0 = state.energy.to(acc) / t_chain + kinetic0
    delta = energy.to(acc) / t_chain + inv_mass.kinetic(p).to(acc) - h0
    finite = torch.isfinite(delta)
    prob = torch.where(finite, delta.neg().clamp_(max=0.0).exp_(), torch.zeros_like(delta))
    accepted = uniform < prob
    mask = accepted.view(-1, *([1] * (x0.dim() - 1)))
    new = HMCState(torch.where(mask, x, x0), torch.where(accepted, energy, state.energy), torch.where(mask, grad, state.grad))
    divergent = ~finite | (delta > DIVERGENCE_THRESHOLD)
    evaluations = n_leapfrog_steps * integrator.gradient_evaluations_per_step
    return new, HMCInfo(accepted, prob, divergent, delta, torch.where(accepted, h0 + delta, h0), evaluations)


def step(state: HMCState, fns: EnergyFunctions, *, step_size: ChainScalar, n_leapfrog_steps: int,
         inv_mass: InverseMass | Tensor | None = None, temperature: ChainScalar = 1.0,
         integrator: SplittingIntegrator = _LEAPFROG, generator: torch.Generator | None = None) -> tuple[HMCState, HMCInfo]:
    """One HMC step of every chain. ``inv_mass``: None (identity), diagonal ``event_shape`` or
    ``(n_chains, *event_shape)``, dense ``(d, d)``, or a prepared :class:`InverseMass`."""
    x = state.x
    noise = torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)
    uniform = torch.rand(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32), device=x.device, generator=generator)
    return transition(state, noise, uniform, fns, step_size=step_size, n_leapfrog_steps=n_leapfrog_steps,
                      inv_mass=as_inverse_mass(inv_mass, x), temperature=temperature, integrator=integrator)


class HMCSampler(MCMCSampler):
    """HMC over a batch of chains.

    Defaults for ``d`` elements per chain on unit-scale targets: ``step_size = 0.5·d^(−1/4)`` (the
    optimal HMC step shrinks like ``d^(−1/4)``) and ``n_leapfrog_steps = ⌈√d⌉``. ``integrator``: any
    registered symplectic ``hamiltonian`` integrator (``leapfrog``, ``mclachlan``, ``yoshida``).
    """

    name = "hmc"

    def __init__(self, energy: EnergyModel, step_size: Any = None, n_leapfrog_steps: int | None = None, *,
                 inv_mass: Any = None, temperature: Any = 1.0, integrator: Any = "leapfrog", **options: Any) -> None:
        super().__init__(energy, **options)
        self.step_size = step_size
        self.n_leapfrog_steps = n_leapfrog_steps
        self.inv_mass = inv_mass
        self.temperature = temperature
        self.integrator = resolve_integrator(integrator, kind="hamiltonian", symplectic=True, user="HMCSampler")

    def default_step_size(self, x: Tensor) -> float:
        """``0.5·d^(−1/4)`` for ``x: (n_chains, *event_shape)`` with ``d`` elements per chain."""
        return 0.5 * event_size(x) ** (-0.25)

    def default_n_leapfrog_steps(self, x: Tensor) -> int:
        """``⌈√d⌉`` (at least 1) for ``d`` elements per chain."""
        return max(1, math.ceil(math.sqrt(event_size(x))))

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts ``step_size`` (default :meth:`default_step_size`; float or ``(n_chains,)``), ``n_leapfrog_steps``
        (positive int, default :meth:`default_n_leapfrog_steps`), ``inv_mass`` (default None: identity) and
        ``temperature`` (default 1; float or ``(n_chains,)``); adds the ``integrator``."""
        unknown = set(overrides) - {"step_size", "n_leapfrog_steps", "inv_mass", "temperature"}
        if unknown:
            raise InputError(f"HMCSampler: unknown tunable(s) {sorted(unknown)}.")
        step_size = overrides.get("step_size", self.step_size)
        n_leapfrog = overrides.get("n_leapfrog_steps", self.n_leapfrog_steps)
        n_leapfrog = self.default_n_leapfrog_steps(x) if n_leapfrog is None else n_leapfrog
        if not isinstance(n_leapfrog, int) or isinstance(n_leapfrog, bool) or n_leapfrog < 1:
            raise InputError(f"n_leapfrog_steps must be a positive integer, got {n_leapfrog!r}.")
        return {
            "step_size": as_chain_scalar(self.default_step_size(x) if step_size is None else step_size, x, "step_size"),
            "n_leapfrog_steps": n_leapfrog,
            "inv_mass": as_inverse_mass(overrides.get("inv_mass", self.inv_mass), x),
            "temperature": as_chain_scalar(overrides.get("temperature", self.temperature), x, "temperature"),
            "integrator": self.integrator,
        }

    def fused_runner(self, x: Tensor, fns: EnergyFunctions, params: dict[str, Any]) -> FusedRunner | str:
        """Many transitions per launch with the ``<energy>_hmc_chain`` kernel (leapfrog, identity mass,
        one temperature for all chains)."""
        if not isinstance(params["integrator"], Leapfrog):
            return f"the integrator is {params['integrator'].name}, the fused chain is leapfrog"
        if params["inv_mass"] is not IDENTITY:
            return "a mass matrix is set, the fused chain uses the identity"
        if not isinstance(params["temperature"], float):
            return "per-chain temperatures are set"
        kernel = self.fused_kernel(x, "<energy>_hmc_chain")
        if isinstance(kernel, str):
            return kernel
        chain, args = kernel.fn, self.energy.kernel_args()
        h, n_leapfrog, beta = params["step_size"], params["n_leapfrog_steps"], 1.0 / params["temperature"]

        def run(state: HMCState, n: int, seed: int, offset: int) -> tuple[HMCState, Tensor, Tensor]:
            x_new, accepted, divergent = chain(state.x, *args, n_steps=n, step_size=h, n_leapfrog_steps=n_leapfrog,
                                               inverse_temperature=beta, seed=seed, offset=offset)
            energy, grad = fns.energy_and_gradient(x_new)
            return HMCState(x_new, energy, grad), accepted, divergent

        return run

    init_fn = staticmethod(init)
    transition_fn = staticmethod(transition)
    step_fn = staticmethod(step)
