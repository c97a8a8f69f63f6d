"""Jittered HMC, the transition of ChEES-HMC (Hoffman, Radul & Sountsov 2021): HMC whose number of leapfrog steps is
drawn afresh at every iteration, the same for every chain.

Iteration ``k`` runs ``L_k = max(1, ⌈u_k·N⌉)`` steps of a symplectic integrator, ``N = max_leapfrog_steps`` (the
trajectory length ``T`` over the step size ``h``), with the jitter ``u_k = 1 − a + a·v_k``, ``a = jitter_amount`` and
``v_k`` either the base-2 Halton (van der Corput) point of ``k + 1`` (``1/2, 1/4, 3/4, 1/8, ...``: evenly spread
lengths, the paper's choice) or uniform on ``[0, 1)``. The jitter is computed on the host from the state's iteration
count (and, for ``"uniform"``, the generator's seed), so choosing ``L_k`` costs no device sync. Random trajectory
lengths break the resonances a fixed length has on targets of several scales. Each iteration is a plain HMC step
given ``L_k``: a proposal with non-finite ``ΔH`` or ``ΔH > 1000`` is rejected and counted as divergent.

``Info`` carries what :func:`ebm_samplers.chees_adaptation.chees_warmup` adapts from: the proposal, its velocity
``M⁻¹p`` and the jitter. :func:`~ebm_samplers.chees_adaptation.chees_warmup` tunes ``h`` and ``T``; sampling then
runs this kernel with them frozen.

**Fused chains** (:func:`build_chain`): given ``L_k``, iteration ``k`` is one transition of the energy's
``<op>_hmc_chain`` kernel (an analytic energy on a backend that has it: ``cpu_fused``, ``cuda``; leapfrog, identity
mass, one temperature), so a sampling run makes one kernel call per run of consecutive iterations with equal ``L``
(with the trajectory recorded, one per iteration). The law is the loop's (same ``L_k``, the same leapfrog and
Metropolis test on ``ΔH``, the same divergence rule); the momenta and uniforms come from the kernel's counter-based
stream keyed by the run's ``seed`` (step ``offset + t`` for the run's ``t``-th iteration), as for HMC's fused chain,
and the ``"uniform"`` jitter sequence is keyed by that stream key instead of the generator's seed. The warm-up keeps
the per-step kernel: it adapts from every chain's proposal, its velocity and its acceptance probability, which the
chain kernel does not return (it returns the kept states and accepted/divergent counts).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.errors import InputError
from ebm_samplers.algorithm import DIVERGENCE_THRESHOLD, Algorithm, Chain, Step
from ebm_samplers.hmc import fused_hmc_chain
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
    with_fields,
)
from ebm_samplers.sampler import AlgorithmSampler

__all__ = [
    "State",
    "Info",
    "Params",
    "JITTERS",
    "init",
    "halton",
    "jitter",
    "transition",
    "build_kernel",
    "ChainState",
    "ChEESChainInfo",
    "build_chain",
    "ALGORITHM",
    "ChEESSampler",
]

JITTERS = ("halton", "uniform")
"""The jitter sequences: ``"halton"`` (quasi-random, evenly spread; the default) or ``"uniform"`` (pseudo-random)."""


@dataclass(frozen=True)
class State:
    """``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``; ``index``: iterations done
    (the position in the jitter sequence)."""

    x: Tensor
    energy: Tensor
    grad: Tensor
    index: int = 0


@dataclass(frozen=True)
class Info:
    """Per chain ``(n,)``: ``accepted``, ``acceptance_prob``, ``divergent``, ``energy_change`` (``ΔH``), ``hamiltonian``
    (``H`` of the state kept); like ``x``: ``proposal`` (the end of the trajectory, before the accept test) and
    ``velocity`` (``M⁻¹p`` there); for all chains: ``jitter`` (``u``), ``n_leapfrog_steps`` (``L``) and
    ``n_gradient_evaluations`` (per chain, this step)."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor
    energy_change: Tensor
    hamiltonian: Tensor
    proposal: Tensor
    velocity: Tensor
    jitter: float
    n_leapfrog_steps: int
    n_gradient_evaluations: int


def _at_least_one(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 1):
        raise InputError(f"{name} must be a finite number >= 1, got {value!r}.")
    return float(value)


def _jitter_kind(value: Any, name: str) -> str:
    if not isinstance(value, str) or value not in JITTERS:
        raise InputError(f"{name} must be one of {', '.join(repr(j) for j in JITTERS)}, got {value!r}.")
    return value


def _fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InputError(f"{name} must be a number in [0, 1], got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Params:
    """``step_size`` ``h`` (None: ``0.5·d^(−1/4)``; float or ``(n_chains,)``), ``max_leapfrog_steps`` ``N = T/h``, a
    number >= 1 (None: ``2⌈√d⌉``, on average about HMC's ``⌈√d⌉`` steps), ``jitter`` (``"halton"`` or ``"uniform"``),
    ``jitter_amount`` ``a`` in ``[0, 1]`` (0: always ``⌈N⌉`` steps, plain HMC), ``inv_mass`` and ``temperature``
    as for HMC."""

    step_size: ChainScalar | None = None
    max_leapfrog_steps: float | None = None
    jitter: str = "halton"
    jitter_amount: float = 1.0
    inv_mass: Any = None
    temperature: ChainScalar = 1.0

    def __post_init__(self) -> None:
        checked(
            self,
            step_size=optional(positive),
            max_leapfrog_steps=optional(_at_least_one),
            jitter=_jitter_kind,
            jitter_amount=_fraction,
            temperature=positive,
        )

    def resolve(self, x: Tensor) -> "Params":
        """These params for the states ``x``: defaults for ``d = event_size(x)`` filled, shapes checked, ``inv_mass`` prepared."""
        d = event_size(x)
        return with_fields(
            self,
            step_size=for_chains(0.5 * d ** (-0.25) if self.step_size is None else self.step_size, x, "step_size"),
            max_leapfrog_steps=float(2 * math.ceil(math.sqrt(d))) if self.max_leapfrog_steps is None else self.max_leapfrog_steps,
            inv_mass=as_inverse_mass(self.inv_mass, x),
            temperature=for_chains(self.temperature, x, "temperature"),
        )


def init(x: Tensor, fns: EnergyFunctions) -> State:
    """The state at ``x`` (one energy-and-gradient evaluation), at the start of the jitter sequence."""
    energy, grad = fns.energy_and_gradient(x)
    return State(x, energy, grad, 0)


def halton(index: int) -> float:
    """The base-2 Halton (van der Corput) point of ``index + 1``: ``1/2, 1/4, 3/4, 1/8, 5/8, ...``, never 0."""
    i, f, v = index + 1, 0.5, 0.0
    while i:
        v += f * (i & 1)
        i >>= 1
        f *= 0.5
    return v


def jitter(params: Params, index: int, seed: int = 0) -> float:
    """``u = 1 − a + a·v`` of iteration ``index`` (module docstring); ``seed`` keys the ``"uniform"`` sequence."""
    v = halton(index) if params.jitter == "halton" else random.Random(f"{seed}:{index}").random()
    return 1.0 - params.jitter_amount + params.jitter_amount * v


def transition(
    state: State,
    noise: Tensor,
    uniform: Tensor,
    fns: EnergyFunctions,
    params: Params,
    integrator: SplittingIntegrator,
    n_steps: int,
    u: float,
) -> tuple[State, Info]:
    """One HMC step of ``n_steps`` integrator steps given standard normal ``noise`` (like ``x``; overwritten) and
    ``uniform ~ U[0, 1)``: ``(n,)``; ``u`` is the jitter that chose ``n_steps`` (reported in the info). A non-finite
    gradient on the trajectory makes ``ΔH`` non-finite, so one test on ``ΔH`` covers positions, energies, gradients."""
    x0, inv_mass = state.x, params.inv_mass
    acc = uniform.dtype
    t = per_chain(params.temperature, x0)
    p = inv_mass.momentum(noise)
    kinetic0 = inv_mass.kinetic(p).to(acc)
    x, p, energy, grad = integrator.integrate(
        x0.clone(), p, state.grad, fns, per_chain(params.step_size, x0), n_steps, inv_mass, 1.0 / t
    )
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    h0 = state.energy.to(acc) / t_chain + kinetic0
    delta = energy.to(acc) / t_chain + inv_mass.kinetic(p).to(acc) - h0
    finite = torch.isfinite(delta)
    prob = torch.where(finite, delta.neg().clamp_(max=0.0).exp_(), torch.zeros_like(delta))
    accepted = uniform < prob
    mask = accepted.view(-1, *([1] * (x0.dim() - 1)))
    new = State(
        torch.where(mask, x, x0),
        torch.where(accepted, energy, state.energy),
        torch.where(mask, grad, state.grad),
        state.index + 1,
    )
    velocity = inv_mass.velocity(p)
    velocity = velocity.clone() if velocity is noise else velocity  # the noise buffer is redrawn next step
    divergent = ~finite | (delta > DIVERGENCE_THRESHOLD)
    evaluations = n_steps * integrator.gradient_evaluations_per_step
    return new, Info(
        accepted, prob, divergent, delta, torch.where(accepted, h0 + delta, h0), x, velocity, u, n_steps, evaluations
    )


def options(energy: EnergyModel, integrator: Any = None) -> dict[str, Any]:
    """``integrator``: a symplectic ``hamiltonian`` integrator or a registered name (default leapfrog)."""
    if integrator is None:
        return {"integrator": Leapfrog()}
    return {"integrator": resolve_integrator(integrator, kind="hamiltonian", symplectic=True, user="ChEESSampler")}


def build_kernel(integrator: SplittingIntegrator | None = None) -> Step:
    """``step(state, fns, generator, params)``: the jitter of ``state.index`` and ``L`` on the host, then ``ξ`` and
    ``u`` drawn into kept buffers, then :func:`transition` with ``integrator`` (default leapfrog)."""
    integrator = integrator or Leapfrog()
    held: list[Any] = [None, None, None]  # key, noise, uniform

    def step(state: State, fns: EnergyFunctions, generator: Optional[torch.Generator], params: Params) -> tuple[State, Info]:
        x = state.x
        key = (x.shape, x.dtype, x.device)
        if held[0] != key:
            held[:] = [
                key,
                torch.empty_like(x),
                torch.empty(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32), device=x.device),
            ]
        seed = 0
        if params.jitter == "uniform":
            seed = generator.initial_seed() if generator is not None else torch.initial_seed()
        u = jitter(params, state.index, seed)
        n_steps = max(1, math.ceil(u * params.max_leapfrog_steps))
        noise, uniform = held[1], held[2]
        noise.normal_(generator=generator)
        uniform.uniform_(generator=generator)
        return transition(state, noise, uniform, fns, params, integrator, n_steps, u)

    return step


class ChainState:
    """The state a fused run hands on: ``x`` and ``index`` as :class:`State`'s, and ``energy``, ``grad`` computed from
    ``x`` when first read (a recorded run reads neither between its one-iteration kernel calls: the kernel evaluates
    ``E`` and ``∇E`` at its start itself)."""

    __slots__ = ("x", "index", "_fns", "_eg")

    def __init__(self, x: Tensor, index: int, fns: EnergyFunctions, energy_and_grad: tuple[Tensor, Tensor] | None = None):
        self.x, self.index, self._fns, self._eg = x, index, fns, energy_and_grad

    def _evaluated(self) -> tuple[Tensor, Tensor]:
        if self._eg is None:
            self._eg = self._fns.energy_and_gradient(self.x)
        return self._eg

    @property
    def energy(self) -> Tensor:
        return self._evaluated()[0]

    @property
    def grad(self) -> Tensor:
        return self._evaluated()[1]


@dataclass(frozen=True)
class ChEESChainInfo:
    """What a fused run of ``n`` iterations reports per chain ``(n_chains,)``: ``accepted`` and ``divergent`` counts
    (int32) and ``n_leapfrog_steps``, the leapfrog steps summed over the iterations (the same for every chain)."""

    accepted: Tensor
    divergent: Tensor
    n_leapfrog_steps: Tensor


def build_chain(
    energy: EnergyModel,
    fns: EnergyFunctions,
    x: Tensor,
    params: Params,
    fused_setting: bool | None,
    integrator: SplittingIntegrator,
) -> Chain | str:
    """Jittered HMC through the energy's ``<op>_hmc_chain`` kernel (module docstring), or why it cannot run: the
    integrator must be leapfrog, the mass the identity and the temperature one number."""
    chain = fused_hmc_chain(energy, fns, x, params, fused_setting, integrator)
    if isinstance(chain, str):
        return chain
    h, beta, n_max = params.step_size, 1.0 / params.temperature, params.max_leapfrog_steps

    def n_steps_of(index: int, seed: int) -> int:
        return max(1, math.ceil(jitter(params, index, seed) * n_max))

    def run(state: Any, n: int, seed: int, offset: int) -> tuple[ChainState, ChEESChainInfo]:
        y, index = state.x, state.index
        accepted = divergent = None
        total, done = 0, 0
        while done < n:  # one call per run of consecutive iterations with the same L (their stream steps follow on)
            steps = n_steps_of(index + done, seed)
            size = 1
            while done + size < n and n_steps_of(index + done + size, seed) == steps:
                size += 1
            y, a, d = chain(
                y,
                n_steps=size,
                step_size=h,
                n_leapfrog_steps=steps,
                inverse_temperature=beta,
                seed=seed,
                offset=offset + done,
            )
            accepted, divergent = (a, d) if accepted is None else (accepted + a, divergent + d)
            total += size * steps
            done += size
        if accepted is None:  # n == 0
            zeros = torch.zeros(y.shape[0], dtype=torch.int32, device=y.device)
            accepted, divergent = zeros, zeros
        counts = torch.full((y.shape[0],), total, dtype=torch.int32, device=y.device)
        return ChainState(y, index + n, fns), ChEESChainInfo(accepted, divergent, counts)

    run.path = (  # type: ignore[attr-defined]
        f"fused chain {chain.kernel.op} ({chain.kernel.backend}), one call per run of iterations with equal leapfrog steps"
    )
    return run


def _warmup(sampler: Any, x0: Tensor, n_warmup: int, *, target_accept: float, generator: Any = None) -> Any:
    """The algorithm's own warm-up, for ``ebm sample``: :func:`~ebm_samplers.chees_adaptation.chees_warmup`."""
    from ebm_samplers.chees_adaptation import chees_warmup  # it imports this module

    return chees_warmup(sampler, x0, n_warmup, target_accept=target_accept, generator=generator)


ALGORITHM = Algorithm(
    "chees",
    Params,
    init,
    build_kernel,
    has_acceptance=True,
    options=options,
    build_chain=build_chain,
    compile_refusal="the number of leapfrog steps changes every iteration (the jitter), and torch.compile would "
    "recompile for each",
    graph_refusal="the number of leapfrog steps changes every iteration (the jitter), chosen on the host",
    warmup=_warmup,
    warmup_adapts="target acceptance {target_accept}; its step size and trajectory length, not a mass matrix",
)


class ChEESSampler(AlgorithmSampler):
    """Jittered HMC with ChEES-adapted tunables: ``ChEESSampler(energy, step_size=None, max_leapfrog_steps=None, *,
    jitter="halton", jitter_amount=1.0, inv_mass=None, temperature=1.0, integrator=None)`` (:class:`Params`).
    Tune ``step_size`` and ``max_leapfrog_steps`` with :func:`~ebm_samplers.chees_adaptation.chees_warmup`. Where the
    energy has a fused HMC chain (``fused=None``: automatic; ``True``: required; ``False``: never) sampling runs
    through it (:func:`build_chain`)."""

    algorithm = ALGORITHM
    positional = ("step_size", "max_leapfrog_steps")
