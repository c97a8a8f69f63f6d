"""Unadjusted Langevin algorithm (ULA): ``x' = x − h∇E(x) + √(2hT)·ξ``, no accept/reject.

``init(x, fns) -> State``; ``build_kernel(integrator=EulerMaruyama()) -> step``;
``step(state, fns, generator, Params(...).resolve(x)) -> (State, Info)``. Object API: :class:`LangevinSampler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Integrator
from ebmcore.energies.program import Program
from ebmcore.errors import InputError
from ebmcore.validation import check_gradient_output
from ebm_samplers.algorithm import (
    Algorithm,
    ChainInfo,
    FusedChain,
    Step,
    StepLoop,
    chain_kernel,
    compiled,
    draw_then,
    fused_chain,
)
from ebm_samplers.integrators import EulerMaruyama, resolve_integrator
from ebm_samplers.integrators.euler_maruyama import SDEUpdate
from ebm_samplers.params import ChainScalar, checked, event_size, for_chains, optional, per_chain, positive, with_fields
from ebm_samplers.sampler import AlgorithmSampler

__all__ = [
    "State",
    "Info",
    "Params",
    "init",
    "transition",
    "build_kernel",
    "noise_scale",
    "ULAChain",
    "ALGORITHM",
    "LangevinSampler",
]


@dataclass(frozen=True)
class State:
    """``x: (n, *event_shape)``. ULA needs nothing else: each step evaluates ``∇E`` where it starts,
    so ``n`` steps cost ``n`` gradients (a state carrying the gradient would pay one more)."""

    x: Tensor


@dataclass(frozen=True)
class Info:
    """ULA accepts every move; non-finite chains are found after the run (``ebmcore.Sampler.sample``)."""


_INFO = Info()


@dataclass(frozen=True)
class Params:
    """``step_size`` (None: :meth:`default_step_size`) and ``temperature``: floats or ``(n_chains,)`` tensors.

    ``noise_scale`` ``σ`` (instead of ``temperature``) sets the noise's std apart from the step, as short-run
    Langevin for training does (Du & Mordatch 2019: ``x' = x − h∇E + σξ``). It is the temperature
    ``T = σ²/(2h)``: the chains then target ``exp(−E/T)``, not the model's density ``exp(−E)``."""

    step_size: ChainScalar | None = None
    temperature: ChainScalar = 1.0
    noise_scale: ChainScalar | None = None
    step_factor = 0.1  # the default step is step_factor·d^(−1/3)

    def __post_init__(self) -> None:
        checked(self, step_size=optional(positive), temperature=positive, noise_scale=optional(positive))
        if self.noise_scale is not None and not (isinstance(self.temperature, float) and self.temperature == 1.0):
            raise InputError("give temperature or noise_scale, not both: noise_scale σ is the temperature σ²/(2·step_size).")

    def default_step_size(self, x: Tensor) -> float:
        """``step_factor·d^(−1/3)`` for ``d`` elements per chain (unit-scale targets)."""
        return self.step_factor * event_size(x) ** (-1.0 / 3.0)

    def resolve(self, x: Tensor) -> "Params":
        """These params for the states ``x``: the default step size filled, per-chain values checked and moved."""
        h = self.default_step_size(x) if self.step_size is None else self.step_size
        t = self.temperature if self.noise_scale is None else self.noise_scale**2 / (2 * h)
        return with_fields(
            self, step_size=for_chains(h, x, "step_size"), temperature=for_chains(t, x, "temperature"), noise_scale=None
        )


def init(x: Tensor, fns: EnergyFunctions) -> State:
    """The state at ``x: (n, *event_shape)``."""
    return State(x)


def noise_scale(step_size: ChainScalar, temperature: ChainScalar) -> ChainScalar:
    """``√(2hT)``, a float or per chain."""
    if isinstance(step_size, float) and isinstance(temperature, float):
        return math.sqrt(2.0 * step_size * temperature)
    return torch.sqrt(2.0 * step_size * temperature)


def transition(state: State, noise: Tensor, fns: EnergyFunctions, params: Params, update: SDEUpdate) -> tuple[State, Info]:
    """One ULA step given the standard normal ``noise`` (like ``x``); deterministic. ``update`` is a bound
    ``sde`` integrator (``integrator.bind(x)``)."""
    h = per_chain(params.step_size, state.x)
    scale = noise_scale(h, per_chain(params.temperature, state.x))
    grad = check_gradient_output(fns.gradient(state.x), state.x, owner="the energy")  # shapes only: (n, 1) would broadcast
    return State(update(state.x, grad, noise, h, scale)), _INFO


def options(energy: EnergyModel, integrator: Any = None, precision: str | None = None) -> dict[str, Any]:
    """``integrator``: an ``sde`` :class:`ebmcore.Integrator` or a registered name (default Euler–Maruyama).
    ``precision``: the products of a fused chain that declares them (ebm-cuda's Triton chains on CUDA: ``"ieee"``,
    ``"tf32x3"``, ``"tf32"``, ``"bf16"``; None: torch's switch, ``torch.set_float32_matmul_precision``), named in the
    run's path; ebm-cuda's feed-forward chain on the CPU takes ``"bf16"`` (torch's ``"medium"``) and computes float32
    products for the others (the CPU has no TF32); the per-step loop and the other CPU kernels compute as they do
    without it."""
    if precision is not None and not isinstance(precision, str):
        raise InputError(f"LangevinSampler: precision must be None or the name of the products, got {precision!r}.")
    return {
        "integrator": EulerMaruyama()
        if integrator is None
        else resolve_integrator(integrator, kind="sde", user="LangevinSampler"),
        "precision": precision,
    }


def build_kernel(integrator: Integrator | None = None, compile: bool = False, precision: str | None = None) -> Step:
    """``step(state, fns, generator, params)``: draws ``ξ`` into a kept buffer, then :func:`transition`
    (through ``torch.compile`` with ``compile``) with ``integrator`` bound to the states (``precision``: the fused
    chain's, not the step's)."""
    integrator = integrator or EulerMaruyama()
    return draw_then(compiled(transition) if compile else transition, uniform=False, bind=lambda x: (integrator.bind(x),))


@dataclass(frozen=True)
class ULAChain:
    """A fused ULA chain (:data:`~ebmcore.sampler.Chain`): ``n`` moves ``x' = x − h∇E(x) + s·ξ`` of the energy's
    ``program`` per call, by ``kernel`` (its program's arguments bound), ``ξ`` from the stream its ``seed`` and
    ``offset`` name. What it computes is declared in its fields, for a caller that runs a fused op of the same family
    from the same backend (contrastive divergence's ``feedforward_contrastive_chain``: the same moves with its loss);
    ``step_size`` ``h`` and ``noise_scale`` ``s``: floats or ``(n_chains,)``."""

    kernel: FusedChain
    program: Program
    step_size: float | Tensor
    noise_scale: float | Tensor

    @property
    def backend(self) -> str:
        """The kernel backend the chain's kernel comes from (its stream and rounding)."""
        return self.kernel.kernel.backend

    @property
    def path(self) -> str:
        """The run's words for this chain: ``fused chain``, with the backend and products where the kernel declares
        them (``fused chain (triton, tf32 products)``)."""
        products = self.kernel.products
        return "fused chain" if products is None else f"fused chain ({self.backend}, {products} products)"

    def __call__(self, state: State, n: int, seed: int, offset: int) -> tuple[State, ChainInfo]:
        x = self.kernel(state.x, n_steps=n, step_size=self.step_size, noise_scale=self.noise_scale, seed=seed, offset=offset)
        return State(x), ChainInfo(None, None)


def build_chain(
    energy: EnergyModel,
    fns: EnergyFunctions,
    x: Tensor,
    params: Params,
    fused_setting: bool | None,
    integrator: Integrator,
    precision: str | None = None,
) -> ULAChain | StepLoop | str:
    """Many ULA steps per launch (a :class:`ULAChain`), the kernel :func:`~ebm_samplers.algorithm.fused_chain` finds
    for the bound energy's program (``fns.program``): ``<energy>_langevin_chain`` for an analytic energy,
    ``feedforward_langevin_chain`` for a feed-forward network, ``conv_langevin_chain`` for a conv stack
    (``ebm_losses.ConvEnergy``); for other energies, one ``langevin_step_philox`` kernel per step (the noise drawn
    inside it; a :class:`StepLoop`). Euler–Maruyama only. ``precision``: the chain's products (:func:`options`)."""
    if not isinstance(integrator, EulerMaruyama):
        return f"the integrator is {integrator.name}, the fused chain is Euler–Maruyama"
    h = params.step_size
    s = noise_scale(h, params.temperature)
    chain = fused_chain("langevin_chain", energy, fns.program, x, fused_setting, precision)
    if not isinstance(chain, str):
        return ULAChain(chain, fns.program, h, s)
    step = chain_kernel("langevin_step_philox", energy, x, fused_setting)
    if isinstance(step, str):
        return f"{chain}; {step}"
    step_fn, gradient = step.fn, fns.gradient

    def run_steps(state: State, n: int, seed: int, offset: int) -> tuple[State, ChainInfo]:
        y = state.x
        for t in range(n):
            y = step_fn(y, gradient(y), h, s, seed, offset + t)
        return State(y), ChainInfo(None, None)

    return StepLoop(run_steps)


ALGORITHM = Algorithm("langevin", Params, init, build_kernel, has_acceptance=False, options=options, build_chain=build_chain)


class LangevinSampler(AlgorithmSampler):
    """ULA: ``LangevinSampler(energy, step_size=None, *, temperature=1.0, integrator=None, precision=None, autocast=None,
    compile=False, fused=None)``. The default step ``0.1·d^(−1/3)`` makes a unit Gaussian's stationary variance ``1/(1 − h/2)``, 2 %
    too wide at ``d = 10``: ULA is biased by O(h), MALA removes the bias. ``integrator``: any ``sde`` integrator.
    ``precision``: a fused chain's products where its kernel declares them (:func:`options`)."""

    algorithm = ALGORITHM
