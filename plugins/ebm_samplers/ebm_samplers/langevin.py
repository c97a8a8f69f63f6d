"""Unadjusted Langevin algorithm (ULA): ``x' = x − h∇E(x) + √(2hT)·ξ``, no accept/reject.

Functional API: ``init(x, fns) -> LangevinState``, ``step(state, fns, step_size=..., ...) -> (state, info)``.
Object API: :class:`LangevinSampler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore import EnergyFunctions, EnergyModel
from ebm_samplers.base import FusedRunner, MCMCSampler
from ebm_samplers.integrators import EulerMaruyama, resolve_integrator
from ebm_samplers.integrators.euler_maruyama import SDEUpdate
from ebm_samplers.tunables import ChainScalar, as_chain_scalar, event_size, per_chain

__all__ = ["LangevinState", "LangevinInfo", "init", "step", "transition", "LangevinSampler"]


@dataclass(frozen=True)
class LangevinState:
    """``x: (n, *event_shape)``. ULA needs nothing else: each step evaluates ``∇E`` where it starts,
    so ``n`` steps cost ``n`` gradients (a state carrying the gradient would pay one more)."""

    x: Tensor


@dataclass(frozen=True)
class LangevinInfo:
    """ULA accepts every move; non-finite chains are found by the object API after the run."""


_INFO = LangevinInfo()


def init(x: Tensor, fns: EnergyFunctions) -> LangevinState:
    return LangevinState(x)


def _noise_scale(step_size: ChainScalar, temperature: ChainScalar) -> ChainScalar:
    if isinstance(step_size, float) and isinstance(temperature, float):
        return math.sqrt(2.0 * step_size * temperature)
    return torch.sqrt(2.0 * torch.as_tensor(step_size) * temperature)


def transition(state: LangevinState, noise: Tensor, fns: EnergyFunctions, *, step_size: ChainScalar,
               temperature: ChainScalar = 1.0, update: SDEUpdate | None = None) -> tuple[LangevinState, LangevinInfo]:
    """One ULA step given the standard normal ``noise`` (same shape as ``x``); deterministic.

    ``update`` is a bound ``sde`` integrator (``integrator.bind(x)``); Euler–Maruyama by default.
    """
    h = per_chain(step_size, state.x)
    scale = _noise_scale(h, per_chain(temperature, state.x))
    update = update or EulerMaruyama().bind(state.x)
    return LangevinState(update(state.x, fns.gradient(state.x), noise, h, scale)), _INFO


def step(state: LangevinState, fns: EnergyFunctions, *, step_size: ChainScalar, temperature: ChainScalar = 1.0,
         generator: torch.Generator | None = None, update: SDEUpdate | None = None) -> tuple[LangevinState, LangevinInfo]:
    """One ULA step of every chain. ``step_size``, ``temperature``: floats or ``(n_chains,)`` tensors."""
    x = state.x
    noise = torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)
    return transition(state, noise, fns, step_size=step_size, temperature=temperature, update=update)


class LangevinSampler(MCMCSampler):
    """ULA over a batch of chains.

    ``step_size`` defaults to ``0.1·d^(−1/3)`` for ``d`` elements per chain (unit-scale targets: the
    stationary variance of a unit Gaussian is ``1/(1 − h/2)``, 2 % too wide at ``d = 10``). ULA is
    biased by O(h); use MALA to remove the bias. ``integrator``: any registered ``sde`` integrator.
    """

    name = "langevin"
    has_acceptance = False

    def __init__(self, energy: EnergyModel, step_size: Any = None, *, temperature: Any = 1.0,
                 integrator: Any = "euler_maruyama", **options: Any) -> None:
        super().__init__(energy, **options)
        self.step_size = step_size
        self.temperature = temperature
        self.integrator = resolve_integrator(integrator, kind="sde", user="LangevinSampler")

    def default_step_size(self, x: Tensor) -> float:
        """``0.1·d^(−1/3)`` for ``x: (n_chains, *event_shape)`` with ``d`` elements per chain."""
        return 0.1 * event_size(x) ** (-1.0 / 3.0)

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts ``step_size`` (default :meth:`default_step_size`) and ``temperature`` (default 1), each a
        float or a ``(n_chains,)`` tensor; adds ``update``, the integrator bound to ``x``."""
        unknown = set(overrides) - {"step_size", "temperature"}
        if unknown:
            raise InputError(f"LangevinSampler: unknown tunable(s) {sorted(unknown)}; ULA takes step_size and temperature.")
        step_size = overrides.get("step_size", self.step_size)
        return {
            "step_size": as_chain_scalar(self.default_step_size(x) if step_size is None else step_size, x, "step_size"),
            "temperature": as_chain_scalar(overrides.get("temperature", self.temperature), x, "temperature"),
            "update": self.integrator.bind(x),
        }

    def fused_runner(self, x: Tensor, fns: EnergyFunctions, params: dict[str, Any]) -> FusedRunner | str:
        """Many ULA steps per launch with the ``<energy>_langevin_chain`` kernel; for other energies,
        one ``langevin_step_philox`` kernel per step (the noise drawn inside it). Euler–Maruyama only."""
        if not isinstance(self.integrator, EulerMaruyama):
            return f"the integrator is {self.integrator.name}, the fused chain is Euler–Maruyama"
        h = params["step_size"]
        s = _noise_scale(h, params["temperature"])
        chain = self.fused_kernel(x, "<energy>_langevin_chain")
        if not isinstance(chain, str):
            chain_fn, args = chain.fn, self.energy.kernel_args()

            def run_chain(state: LangevinState, n: int, seed: int, offset: int) -> tuple[LangevinState, None, None]:
                return LangevinState(chain_fn(state.x, *args, n_steps=n, step_size=h, noise_scale=s, seed=seed, offset=offset)), None, None

            return run_chain
        step = self.fused_kernel(x, "langevin_step_philox")
        if isinstance(step, str):
            return f"{chain}; {step}"
        step_fn, gradient = step.fn, fns.gradient

        def run_steps(state: LangevinState, n: int, seed: int, offset: int) -> tuple[LangevinState, None, None]:
            y = state.x
            for t in range(n):
                y = step_fn(y, gradient(y), h, s, seed, offset + t)
            return LangevinState(y), None, None

        return run_steps

    init_fn = staticmethod(init)
    transition_fn = staticmethod(transition)
    step_fn = staticmethod(step)
