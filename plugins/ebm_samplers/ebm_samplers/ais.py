"""Annealed importance sampling (Neal 2001) for the log partition function ``log Z = log ∫ exp(−E(x)) dx``.

Chains start from a tractable base ``p₀ = N(loc, diag(scale²))`` and move along the geometric path
``E_β = (1 − β)·E₀ + β·E`` for ``0 = β₀ < β₁ < … < β_K = 1``; each chain's log weight gathers
``(β_k − β_{k−1})·(E₀(x) − E(x))`` before the ``k``-th MALA or HMC transition, which leaves ``exp(−E_{β_k})``
invariant. ``Z / Z₀`` is the mean of the weights, so ``log Z`` is ``log Z₀`` plus the log-mean-exp of the
log weights; its standard error is the delta method's ``std(w) / (√n · mean(w))``. The mean log weight
is a stochastic lower bound (Jensen) with the plain standard error over chains.

The transitions come from the samplers' functional API (``mala.build_kernel()``, ``hmc.build_kernel()``);
their step size is adapted between temperatures from the population's mean acceptance (a tensor, no
host sync), as adaptive SMC does: the bias this brings is ``O(1/n_chains)``, negligible against the
reported error. ``adapt=False`` keeps the step fixed (then the estimator is exactly unbiased in ``Z``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.energies.binding import bind_energy
from ebmcore.errors import InputError
from ebmcore.validation import check_energy_output, check_gradient_output
from ebm_samplers import hmc, mala
from ebm_samplers.algorithm import GradientState
from ebm_samplers.params import with_fields

__all__ = ["AISResult", "ExactBase", "estimate_log_z", "sigmoid_betas"]

_TRANSITIONS = {"mala": mala, "hmc": hmc}


@dataclass(frozen=True)
class AISResult:
    """``log_z`` (log-mean-exp estimate of ``log Z``) and its delta-method ``standard_error``; ``mean_log_weight``
    (a lower bound on ``log Z`` in expectation, plus ``log Z₀``) with its standard error over chains;
    ``log_weights: (n_chains,)`` (including ``log Z₀``), their ``effective_sample_size``, the transitions'
    mean ``acceptance_rate`` and the final ``samples: (n_chains, *event_shape)`` (approximately from ``exp(−E)``).

    Neither ``standard_error`` nor ``effective_sample_size`` can see a mode that no chain visits: the chains then
    agree on the mass they found, so a base that misses a mode gives a confident ``log Z`` that is too low (one
    mode of weight 0.9 found: ``log 0.9``, with every weight effective). Only an estimate that does not depend on
    the chains finding every mode (a grid, an exact value) catches it."""

    log_z: float
    standard_error: float
    mean_log_weight: float
    mean_log_weight_se: float
    effective_sample_size: float
    acceptance_rate: float
    n_chains: int
    n_temperatures: int
    transition: str
    log_weights: Tensor
    samples: Tensor

    def summary(self) -> dict[str, Any]:
        """The scalar fields, for a ``metrics.json``."""
        return {
            k: getattr(self, k)
            for k in (
                "log_z",
                "standard_error",
                "mean_log_weight",
                "mean_log_weight_se",
                "effective_sample_size",
                "acceptance_rate",
                "n_chains",
                "n_temperatures",
                "transition",
            )
        }


def sigmoid_betas(n_temperatures: int, sharpness: float = 4.0) -> list[float]:
    """``β_0 = 0 < … < β_K = 1`` (``K = n_temperatures``) on a sigmoid schedule (Grosse et al. 2013): dense at both ends."""
    if not isinstance(n_temperatures, int) or isinstance(n_temperatures, bool) or n_temperatures < 1:
        raise InputError(f"n_temperatures must be a positive integer, got {n_temperatures!r}.")
    s = torch.sigmoid(sharpness * torch.linspace(-1.0, 1.0, n_temperatures + 1, dtype=torch.float64))
    s = (s - s[0]) / (s[-1] - s[0])
    return [0.0, *s[1:-1].tolist(), 1.0]


Base = Callable[[Tensor], "tuple[Tensor, Tensor]"]


def _gaussian_base(loc: Tensor, inv_var: Tensor) -> Base:
    """``x -> (E₀(x), ∇E₀(x))`` of ``N(loc, diag(1/inv_var))``: ``E₀ = ½ Σ (x − loc)²·inv_var``."""
    dims = tuple(range(1, loc.dim() + 1))

    def base(x: Tensor) -> tuple[Tensor, Tensor]:
        z = (x - loc) * inv_var
        return 0.5 * (z * (x - loc)).sum(dims), z

    return base


@dataclass(frozen=True)
class ExactBase:
    """A normalised base AIS starts from exactly, where neither a Gaussian nor a box fits the energy's mass (a fitted
    mixture): ``energy(x) -> E₀(x): (n,)``, differentiable in ``x: (n, *event_shape)``; ``sample(n, generator) ->
    (n, *event_shape)``, exact draws of ``exp(−E₀)/Z₀``; ``log_z = log Z₀``. With ``scale_tril`` these are in the
    whitened coordinates ``z = L⁻¹(x − loc)``."""

    energy: Callable[[Tensor], Tensor]
    sample: Callable[[int, "torch.Generator | None"], Tensor]
    log_z: float


def _exact_base(base: ExactBase) -> Base:
    """``x -> (E₀(x), ∇E₀(x))`` of ``base``, the gradient by autograd."""

    def fn(x: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            y = x.detach().requires_grad_(True)
            e = base.energy(y)
            (g,) = torch.autograd.grad(e.sum(), y)
        return e.detach(), g

    return fn


def _box_base(low: float, high: float) -> Base:
    """``x -> (E₀(x), ∇E₀(x))`` of the uniform density on ``[low, high]^d``: ``0`` inside, ``+inf`` outside, so MALA and
    HMC reject every proposal that leaves the box."""

    def base(x: Tensor) -> tuple[Tensor, Tensor]:
        inside = ((x >= low) & (x <= high)).flatten(1).all(1)
        zero = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        return torch.where(inside, zero, torch.full_like(zero, math.inf)), torch.zeros_like(x)

    return base


class _Path:
    """The hot-loop callables of ``E_β = (1 − β)·E₀ + β·E`` at the current ``beta`` (``0 ≤ β < 1``). Each evaluation
    keeps its components ``(E, ∇E, E₀, ∇E₀)`` in ``last``: a transition's last evaluation is at its proposal (MALA's
    only one, HMC's at the trajectory's end), so the components of the state kept need no recomputation."""

    def __init__(self, fns: EnergyFunctions, base: Base) -> None:
        self.fns, self.base, self.beta = fns, base, 0.0
        self.last: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self.functions = EnergyFunctions(
            lambda x: self.energy_and_gradient(x)[0], lambda x: self.energy_and_gradient(x)[1], self.energy_and_gradient
        )

    def energy_and_gradient(self, x: Tensor) -> tuple[Tensor, Tensor]:
        e, g = self.fns.energy_and_gradient(x)
        e0, g0 = self.base(x)
        self.last = (e, g, e0, g0)
        b = self.beta
        return (1 - b) * e0 + b * e, (1 - b) * g0 + b * g


def estimate_log_z(
    energy: EnergyModel,
    n_chains: int = 256,
    n_temperatures: int = 500,
    *,
    event_shape: Sequence[int] | None = None,
    loc: Any = 0.0,
    scale: Any = 1.0,
    scale_tril: Tensor | None = None,
    transition: str = "mala",
    n_steps: int = 1,
    step_size: float | None = None,
    n_leapfrog_steps: int | None = None,
    adapt: bool = True,
    target_accept: float = 0.65,
    betas: Sequence[float] | None = None,
    bounds: tuple[float, float] | None = None,
    base: ExactBase | None = None,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: Any = None,
) -> AISResult:
    """Estimate ``log Z`` of ``exp(−E)`` with ``n_chains`` AIS chains over ``n_temperatures`` (or the schedule ``betas``).

    ``loc`` and ``scale`` (numbers or tensors broadcasting to ``event_shape``) define the base ``N(loc, scale²)``;
    pick them to cover the energy's mass (e.g. the data's mean and std). With ``scale_tril: (d, d)`` (lower
    triangular, ``d = prod(event_shape)``) the base is ``N(loc, LLᵀ)`` with full covariance instead: the chains then
    run in the whitened coordinates ``z = L⁻¹(x − loc)``, where the base is ``N(0, I)`` and one step size suits
    every direction (``log Z`` of ``x`` is that of ``z`` plus ``Σ log Lᵢᵢ``; the samples are mapped back to ``x``). With ``bounds = (low, high)`` the domain is
    the box ``[low, high]^d`` instead (images on ``[−1, 1]``): the base is uniform on it, ``log Z`` is that of
    ``exp(−E)`` restricted to it, and moves that leave it are rejected. ``transition``: ``"mala"`` or ``"hmc"``,
    ``n_steps`` per temperature; ``step_size`` starts at the sampler's default times the mean base scale. With ``base``
    (an :class:`ExactBase`: an energy's own fitted mixture) the chains start from its exact draws and anneal from its
    ``E₀`` instead of the Gaussian (in the whitened coordinates when ``scale_tril`` is given; not with ``bounds``).
    ``event_shape`` defaults to the energy's; dtype and device to its parameters' (else float64, CPU).
    """
    if transition not in _TRANSITIONS:
        raise InputError(f"transition must be one of {', '.join(_TRANSITIONS)}, got {transition!r}.")
    if not isinstance(n_chains, int) or isinstance(n_chains, bool) or n_chains < 2:
        raise InputError(f"n_chains must be an integer >= 2 (the standard error needs two), got {n_chains!r}.")
    if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
        raise InputError(f"n_steps must be a positive integer, got {n_steps!r}.")
    if not 0 < target_accept < 1:
        raise InputError(f"target_accept must be in (0, 1), got {target_accept!r}.")
    shape = tuple(event_shape) if event_shape is not None else energy.event_shape
    if shape is None:
        raise InputError(f"{type(energy).__name__} sets no event_shape: pass event_shape=(d,) (or the image's (C, H, W)).")
    schedule = sigmoid_betas(n_temperatures) if betas is None else [float(b) for b in betas]
    if len(schedule) < 2 or schedule[0] != 0.0 or schedule[-1] != 1.0 or any(b <= a for a, b in zip(schedule, schedule[1:])):
        raise InputError("betas must increase strictly from 0.0 to 1.0, e.g. ebm_samplers.ais.sigmoid_betas(500).")
    ref = energy._reference_tensor()
    dtype = dtype or (ref.dtype if ref is not None else torch.float64)
    device = torch.device(device) if device is not None else (ref.device if ref is not None else torch.device("cpu"))
    d = math.prod(shape)
    if base is not None and bounds is not None:
        raise InputError("give bounds or base, not both: an exact base is not confined to the box.")
    if scale_tril is not None:
        if bounds is not None:
            raise InputError("give bounds or scale_tril, not both: the full-covariance base is unbounded.")
        return _whitened(
            energy,
            n_chains,
            n_temperatures,
            shape=shape,
            loc=loc,
            scale_tril=scale_tril,
            transition=transition,
            n_steps=n_steps,
            step_size=step_size,
            n_leapfrog_steps=n_leapfrog_steps,
            adapt=adapt,
            target_accept=target_accept,
            betas=schedule,
            base=base,
            generator=generator,
            dtype=dtype,
            device=device,
        )
    if base is not None:
        x = base.sample(n_chains, generator).to(dtype=dtype, device=device).reshape(n_chains, *shape)
        log_z0, mean_scale = float(base.log_z), float(x.flatten(1).std(0).mean())
        start = _exact_base(base)
    elif bounds is not None:
        low, high = (float(b) for b in bounds)
        if not high > low:
            raise InputError(f"bounds must be (low, high) with high > low, got {bounds!r}.")
        start = _box_base(low, high)
        log_z0 = d * math.log(high - low)
        x = low + (high - low) * torch.rand((n_chains, *shape), generator=generator, dtype=dtype, device=device)
        mean_scale = (high - low) / 4
    else:
        loc_t = torch.as_tensor(loc, dtype=dtype, device=device).expand(shape).contiguous()
        scale_t = torch.as_tensor(scale, dtype=dtype, device=device).expand(shape).contiguous()
        if not bool((scale_t > 0).all()) or not bool(torch.isfinite(loc_t).all()):
            raise InputError("the base scale must be positive and its loc finite.")
        start = _gaussian_base(loc_t, scale_t.pow(-2))
        log_z0 = float(scale_t.double().log().sum()) + 0.5 * d * math.log(2 * math.pi)
        x = loc_t + scale_t * torch.randn((n_chains, *shape), generator=generator, dtype=dtype, device=device)
        mean_scale = float(scale_t.mean())

    energy.validate(x, name="the AIS states")
    return _anneal(
        bind_energy(energy, x),
        x,
        start,
        log_z0,
        mean_scale,
        owner=type(energy).__name__,
        n_chains=n_chains,
        schedule=schedule,
        transition=transition,
        n_steps=n_steps,
        step_size=step_size,
        n_leapfrog_steps=n_leapfrog_steps,
        adapt=adapt,
        target_accept=target_accept,
        generator=generator,
        dtype=dtype,
        device=device,
    )


class _Whitened(EnergyModel):
    """``z -> E(loc + L·z)`` for ``z: (n, d)``, the energy ``E`` seen in whitened coordinates (a view, not an owner)."""

    def __init__(self, energy: EnergyModel, loc: Tensor, tril: Tensor, shape: tuple[int, ...]) -> None:
        super().__init__()
        object.__setattr__(self, "_energy", energy)
        self.loc, self.tril, self.shape = loc, tril, shape
        self.event_shape = (tril.shape[0],)

    def _reference_tensor(self) -> Tensor | None:
        return self.tril

    def unwhiten(self, z: Tensor) -> Tensor:
        return (self.loc + z @ self.tril.T).reshape(z.shape[0], *self.shape)

    def compute_energy(self, z: Tensor) -> Tensor:
        return self._energy.compute_energy(self.unwhiten(z))

    def bind(self, like: Tensor) -> EnergyFunctions:
        fns = bind_energy(self._energy, self.unwhiten(like))

        def energy_and_gradient(z: Tensor) -> tuple[Tensor, Tensor]:
            e, g = fns.energy_and_gradient(self.unwhiten(z))
            return e, g.flatten(1) @ self.tril  # ∇_z = Lᵀ∇_x, as rows

        return EnergyFunctions(
            lambda z: fns.energy(self.unwhiten(z)), lambda z: energy_and_gradient(z)[1], energy_and_gradient, fns.path
        )


def _whitened(
    energy: EnergyModel,
    n_chains: int,
    n_temperatures: int,
    *,
    shape: tuple[int, ...],
    loc: Any,
    scale_tril: Tensor,
    generator: torch.Generator | None,
    dtype: torch.dtype | None,
    device: Any,
    **options: Any,
) -> AISResult:
    """:func:`estimate_log_z` from ``N(loc, LLᵀ)``: AIS of ``z -> E(loc + Lz)`` from ``N(0, I)`` (or from the exact
    ``base`` in ``options``, given in ``z``), ``log Z`` shifted by ``log|det L|``, samples mapped back."""
    d = math.prod(shape)
    ref = energy._reference_tensor()
    dtype = dtype or (ref.dtype if ref is not None else torch.float64)
    device = torch.device(device) if device is not None else (ref.device if ref is not None else torch.device("cpu"))
    tril = torch.as_tensor(scale_tril).to(dtype=dtype, device=device)
    if tril.shape != (d, d):
        raise InputError(f"scale_tril must have shape ({d}, {d}) for event shape {shape}, got {tuple(tril.shape)}.")
    diagonal = tril.diagonal()
    if not bool((diagonal > 0).all()) or not bool(torch.isfinite(tril).all()) or not torch.equal(tril, tril.tril()):
        raise InputError(
            "scale_tril must be finite, lower triangular, with a positive diagonal (a Cholesky factor: "
            "torch.linalg.cholesky(covariance), not its transpose)."
        )
    loc_t = torch.as_tensor(loc, dtype=dtype, device=device)
    loc_t = loc_t.reshape(d) if loc_t.numel() == d else loc_t.expand(shape).reshape(d)  # (d,) or like the event
    view = _Whitened(energy, loc_t, tril, shape)
    result = estimate_log_z(
        view,
        n_chains,
        1,
        betas=options.pop("betas"),
        event_shape=(d,),
        generator=generator,
        dtype=dtype,
        device=device,
        **options,
    )
    shift = float(diagonal.double().log().sum())
    return AISResult(
        result.log_z + shift,
        result.standard_error,
        result.mean_log_weight + shift,
        result.mean_log_weight_se,
        result.effective_sample_size,
        result.acceptance_rate,
        result.n_chains,
        result.n_temperatures,
        result.transition,
        result.log_weights + shift,
        view.unwhiten(result.samples),
    )


def _anneal(
    fns: EnergyFunctions,
    x: Tensor,
    base: Base,
    log_z0: float,
    mean_scale: float,
    *,
    owner: str,
    n_chains: int,
    schedule: list[float],
    transition: str,
    n_steps: int,
    step_size: float | None,
    n_leapfrog_steps: int | None,
    adapt: bool,
    target_accept: float,
    generator: torch.Generator | None,
    dtype: torch.dtype,
    device: torch.device,
) -> AISResult:
    """The AIS loop of :func:`estimate_log_z` from states ``x`` drawn from ``base`` (whose ``log Z`` is ``log_z0``);
    the energy ``owner`` names is checked once, at ``x`` (its energy one per row, its gradient shaped like ``x`` and
    in its dtype), as a sampler checks its initial state."""
    module = _TRANSITIONS[transition]
    defaults = module.Params(n_leapfrog_steps=n_leapfrog_steps) if transition == "hmc" else module.Params()
    params = defaults.resolve(x)
    h0 = params.step_size * mean_scale if step_size is None else float(step_size)
    h = torch.full((n_chains,), h0, dtype=dtype, device=device)
    kernel = module.build_kernel()
    log_w = torch.zeros(n_chains, dtype=torch.float64, device=device)
    accept_sum = torch.zeros((), dtype=torch.float64, device=device)
    path = _Path(fns, base)
    with torch.no_grad():
        path.energy_and_gradient(x)
        parts = path.last  # (E, ∇E, E₀, ∇E₀) at x, carried along: one evaluation per transition
        check_energy_output(parts[0], x, owner=owner)
        check_gradient_output(parts[1], x, owner=owner)
        for k in range(1, len(schedule)):
            beta, previous = schedule[k], schedule[k - 1]
            e, g, e0, g0 = parts
            log_w += (beta - previous) * (e0 - e).double()
            if k == len(schedule) - 1:
                break
            path.beta = beta
            state = GradientState(x, (1 - beta) * e0 + beta * e, (1 - beta) * g0 + beta * g)
            step_params = with_fields(params, step_size=h)
            acc = torch.zeros((), dtype=torch.float64, device=device)
            for _ in range(n_steps):
                state, info = kernel(state, path.functions, generator, step_params)
                keep = info.accepted
                parts = tuple(
                    torch.where(keep.view(-1, *([1] * (new.dim() - 1))), new, old) for new, old in zip(path.last, parts)
                )
                acc += info.acceptance_prob.double().mean()
            acc /= n_steps
            accept_sum += acc
            if adapt:
                h = h * torch.exp(2.0 * (acc - target_accept)).to(dtype)
            x = state.x
    log_w = log_w + log_z0
    n = n_chains
    finite = torch.isfinite(log_w)
    top = log_w[finite].max() if bool(finite.any()) else torch.tensor(float("nan"), dtype=torch.float64)
    w = torch.exp(log_w - top)
    mean_w = w.mean()
    log_z = float(top + mean_w.log())
    se = float(w.std() / (math.sqrt(n) * mean_w))
    ess = float(w.sum() ** 2 / (w * w).sum())
    transitions = max(len(schedule) - 2, 1)
    return AISResult(
        log_z,
        se,
        float(log_w.mean()),
        float(log_w.std() / math.sqrt(n)),
        ess,
        float(accept_sum) / transitions,
        n,
        len(schedule) - 1,
        transition,
        log_w,
        x,
    )
