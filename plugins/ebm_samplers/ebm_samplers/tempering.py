"""Parallel tempering (replica exchange): replicas of every chain at temperatures ``1 = T₁ < … < T_K``
move with any base algorithm that has a temperature, and adjacent replicas swap states with
probability ``min(1, exp((E_k − E_{k+1})(1/T_k − 1/T_{k+1})))``. Samples are the ``T = 1`` replicas.

Replicas are rows of one batch (replica-major, ``K·n`` rows) with a per-row temperature, so one
base step moves all of them. Each step attempts every adjacent pair: even pairs, then odd pairs.
:func:`algorithm` turns a base algorithm into the tempered one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Sampler, registry
from ebmcore.errors import InputError
from ebmcore.energies.binding import bind_energy
from ebm_samplers.algorithm import Algorithm, Step
from ebm_samplers.params import positive, whole
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["State", "Info", "Params", "algorithm", "geometric_temperatures", "ParallelTemperingSampler"]


def geometric_temperatures(n_replicas: int, max_temperature: float) -> list[float]:
    """``n_replicas`` temperatures from 1 to ``max_temperature``, geometrically spaced."""
    if n_replicas == 1:
        return [1.0]
    return [float(max_temperature ** (k / (n_replicas - 1))) for k in range(n_replicas)]


@dataclass(frozen=True)
class State:
    """``replicas``: the base algorithm's state over ``K·n`` rows (replica-major); ``x`` is the ``T = 1`` block."""

    replicas: Any
    n_chains: int

    @property
    def x(self) -> Tensor:
        return self.replicas.x[: self.n_chains]

    @property
    def energy(self) -> Tensor:
        e = self.replicas.energy
        return e[: self.n_chains] if e.dim() else e  # a scalar (a bad energy) goes to the run's shape check as it is

    @property
    def grad(self) -> Tensor:
        """The ``T = 1`` block of the base state's gradient (AttributeError where the base state carries none), for
        the run's check of the gradient's shape at the initial state."""
        g = self.replicas.grad
        return g[: self.n_chains] if g.dim() else g


@dataclass(frozen=True)
class Info:
    """``swap_accepted: (K−1, n)`` per adjacent pair and chain; ``base``: the base algorithm's info for
    all replicas; ``accepted``/``divergent``: the base's, for the ``T = 1`` replicas."""

    swap_accepted: Tensor
    base: Any
    accepted: Tensor | None
    divergent: Tensor | None


@dataclass(frozen=True)
class Params:
    """``base``: the base algorithm's params (its ``temperature`` is replaced by the replicas' per-row temperatures);
    ``temperatures``: ascending, starting at 1, at least two."""

    base: Any
    temperatures: tuple[float, ...]
    inv_temperature_gaps: tuple[float, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        t = self.temperatures
        if len(t) < 2 or abs(t[0] - 1.0) > 1e-12 or any(not b > a for a, b in zip(t, t[1:])) or not math.isfinite(t[-1]):
            raise InputError(f"temperatures must be ascending, start at 1 and number at least 2, got {list(t)!r}.")
        if "temperature" not in {f.name for f in fields(self.base)}:
            raise InputError(
                f"parallel tempering needs a base sampler with a temperature; {type(self.base).__qualname__} has none."
            )
        object.__setattr__(self, "temperatures", tuple(float(v) for v in t))
        inv = [1.0 / v for v in self.temperatures]  # Python floats: no sync in the loop
        object.__setattr__(self, "inv_temperature_gaps", tuple(a - b for a, b in zip(inv, inv[1:])))

    def resolve(self, x: Tensor) -> "Params":
        """The base params resolved for the ``K·n`` replica rows, with their per-row temperatures."""
        rows = torch.tensor(self.temperatures, dtype=x.dtype, device=x.device).repeat_interleave(x.shape[0])
        return replace(self, base=replace(self.base, temperature=rows).resolve(_replicate(x, len(self.temperatures))))


def _replicate(x: Tensor, k: int) -> Tensor:
    return x.repeat(k, *([1] * (x.dim() - 1)))


def _swap(state: Any, n: int, k: int, accept: Tensor) -> Any:
    """Exchange the rows of replica blocks ``k`` and ``k+1`` where ``accept`` (``(n,)``)."""
    fields_ = {}
    for name, value in vars(state).items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] >= (k + 2) * n:
            a, b = value[k * n : (k + 1) * n], value[(k + 1) * n : (k + 2) * n]
            mask = accept.view(-1, *([1] * (a.dim() - 1)))
            new = value.clone()
            new[k * n : (k + 1) * n] = torch.where(mask, b, a)
            new[(k + 1) * n : (k + 2) * n] = torch.where(mask, a, b)
            fields_[name] = new
        else:
            fields_[name] = value
    return type(state)(**fields_)


def algorithm(base: Algorithm, n_replicas: int) -> Algorithm:
    """The tempered version of ``base`` (whose state must carry ``energy``) with ``n_replicas`` temperatures."""
    if not base.has_acceptance:
        raise InputError(
            f"parallel tempering needs a base sampler with a temperature whose state carries the energy "
            f"(mala, hmc or nuts); {base.name} is not one."
        )

    def init(x: Tensor, fns: EnergyFunctions) -> State:
        """Every replica starts at ``x: (n_chains, *event_shape)``."""
        return State(base.init(_replicate(x, n_replicas), fns), x.shape[0])

    def build_kernel(base_options: dict[str, Any]) -> Step:
        """The tempered step over ``base.build_kernel(**base_options)``."""
        base_step = base.build_kernel(**base_options)

        def step(state: State, fns: EnergyFunctions, generator: torch.Generator | None, params: Params) -> tuple[State, Info]:
            """One base step of all ``K·n`` replicas, then a swap attempt for every adjacent pair (even, then odd pairs)."""
            n = state.n_chains
            replicas, base_info = base_step(state.replicas, fns, generator, params.base)
            acc = torch.promote_types(replicas.x.dtype, torch.float32)
            swaps = torch.zeros((n_replicas - 1, n), dtype=torch.bool, device=replicas.x.device)
            for parity in (0, 1):
                for pair in range(parity, n_replicas - 1, 2):
                    e = replicas.energy.to(acc)
                    e_lo, e_hi = e[pair * n : (pair + 1) * n], e[(pair + 1) * n : (pair + 2) * n]
                    log_ratio = (e_lo - e_hi) * params.inv_temperature_gaps[pair]
                    u = torch.rand(n, generator=generator, device=replicas.x.device, dtype=acc)
                    accept = torch.isfinite(log_ratio) & (u.log() < log_ratio)
                    replicas = _swap(replicas, n, pair, accept)
                    swaps[pair] = accept
            accepted = getattr(base_info, "accepted", None)
            divergent = getattr(base_info, "divergent", None)
            return State(replicas, n), Info(
                swaps, base_info, None if accepted is None else accepted[:n], None if divergent is None else divergent[:n]
            )

        return step

    return Algorithm(
        "parallel_tempering",
        Params,
        init,
        build_kernel,
        has_acceptance=True,
        compile_refusal="compile its base sampler instead (base_options={'compile': True})",
    )


class ParallelTemperingSampler(AlgorithmSampler):
    """Replica exchange around a base sampler given by name (built on the same energy with
    ``base_options``) or as a ready sampler: ``ParallelTemperingSampler(energy, base="mala", *,
    temperatures=None, n_replicas=4, max_temperature=10.0, base_options=None)``.

    ``temperatures`` (ascending, starting at 1) default to ``n_replicas`` geometric steps up to
    ``max_temperature``. Returned samples, trajectory and diagnostics are those of ``T = 1``.
    """

    def __init__(
        self,
        energy: EnergyModel,
        base: Any = "mala",
        *,
        temperatures: Sequence[float] | None = None,
        n_replicas: int = 4,
        max_temperature: float = 10.0,
        base_options: dict[str, Any] | None = None,
        autocast: torch.dtype | None = None,
        compile: bool = False,
        fused: bool | None = None,
    ) -> None:
        Sampler.__init__(self, energy)
        if temperatures is None:
            temps = geometric_temperatures(whole(2)(n_replicas, "n_replicas"), positive(max_temperature, "max_temperature"))
        else:
            try:
                temps = [float(t) for t in temperatures]
            except (TypeError, ValueError):
                raise InputError(f"temperatures must be a list of numbers, ascending from 1, got {temperatures!r}.") from None
        self.base = registry.get("sampler", base)(energy, **(base_options or {})) if isinstance(base, str) else base
        if not isinstance(self.base, AlgorithmSampler) or self.base.energy is not energy:
            raise InputError("base must be a registered sampler name or an ebm_samplers sampler on the same energy.")
        self.algorithm = algorithm(self.base.algorithm, len(temps))
        base_static = dict(self.base.options, **({"compile": True} if self.base.compile else {}))
        autocast = autocast if autocast is not None else self.base.autocast  # the base's settings hold unless overridden
        self._setup({"base_options": base_static}, Params(self.base.params, tuple(temps)), autocast, compile, fused)

    def bind(self, x: Tensor) -> EnergyFunctions:
        """The energy bound as the base sampler needs it (traceable for a compiled base)."""
        return bind_energy(self.energy, x, autocast=self.autocast, traceable=self.base.compile)
