"""Warm-up adaptation: dual-averaging step size (Nesterov 2009; Hoffman & Gelman 2014) and a mass matrix
(a diagonal one from Welford's running variance; with ``metric="dense"`` or ``"low_rank"`` one from Welford's
running covariance) in Stan's windows. Every chain adapts on its own draws; with
``pooled`` the chains then share the median chain's step size and variances (robust to chains that have not
met yet), otherwise each keeps its own.

Step-level components (``DualAveraging``, ``WelfordVariance``, ``WelfordCovariance``, ``stan_windows``,
:func:`regularize_covariance`, :func:`low_rank_inverse_mass`) let a custom loop
adapt; :func:`warmup` runs the whole thing for any ``ebm_samplers`` sampler that reports an acceptance
statistic (MALA, HMC, NUTS) and returns new ``Params``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore.sampler import check_run_arguments
from ebm_samplers.params import InverseMass, as_inverse_mass, event_size, with_fields

__all__ = [
    "DualAveraging",
    "WelfordVariance",
    "WelfordCovariance",
    "regularize_covariance",
    "low_rank_inverse_mass",
    "METRICS",
    "check_metric",
    "stan_windows",
    "WarmupResult",
    "warmup",
    "cannot_warm_up",
]

METRICS = ("diag", "dense", "low_rank")
"""The metrics :func:`warmup` adapts: a diagonal ``M⁻¹`` (the default), a dense one, or diagonal plus rank ``k``."""


class DualAveraging:
    """Dual averaging of ``log h`` towards an acceptance statistic of ``target``.

    ``update(accept_stat)`` takes the statistic of the last step, a scalar (pooled) or ``(n_chains,)``
    (per chain), and returns the step size to use next; ``final()`` is the averaged step size to
    keep after warm-up. Constants as in Stan: ``γ = 0.05``, ``t₀ = 10``, ``κ = 0.75``, ``μ = log(10 h₀)``.
    """

    def __init__(
        self,
        initial_step_size: float | Tensor,
        target: float = 0.8,
        *,
        gamma: float = 0.05,
        t0: float = 10.0,
        kappa: float = 0.75,
        explore: bool = True,
    ) -> None:
        if not 0 < target < 1:
            raise InputError(f"target acceptance must be in (0, 1), got {target!r}.")
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(initial_step_size, explore)

    def restart(self, step_size: float | Tensor, explore: bool = True) -> None:
        """Start again around ``step_size`` (Stan does this after every mass-matrix update). ``explore``: aim the
        first steps at ``10·step_size``, as Stan does; False: stay near ``step_size``, one adapted already. One step
        size (a number or a 0-d tensor) is adapted in Python floats (no tensor op per update), one per chain in a
        float64 tensor."""
        log_h = torch.log(torch.as_tensor(step_size, dtype=torch.float64))
        if log_h.dim() == 0:
            self.log_h = float(log_h)
            self.mu = math.log(10.0) * explore + self.log_h
            self.log_h_avg = self.h_bar = 0.0
        else:
            self.mu = math.log(10.0) * explore + log_h
            self.log_h = log_h
            self.log_h_avg = torch.zeros_like(log_h)
            self.h_bar = torch.zeros_like(log_h)
        self.t = 0

    def update(self, accept_stat: Tensor | float) -> float | Tensor:
        """Record one step's acceptance statistic (a number, or one per chain) and return the next step size."""
        if isinstance(self.log_h, float):
            if isinstance(accept_stat, Tensor):  # per chain: their mean, each as a number is taken
                accept_stat = float(torch.nan_to_num(accept_stat.double(), nan=0.0).clamp(0.0, 1.0).mean())
            a = 0.0 if math.isnan(accept_stat) else min(max(float(accept_stat), 0.0), 1.0)
        else:
            a = torch.as_tensor(accept_stat, dtype=torch.float64).cpu()
            a = torch.nan_to_num(a, nan=0.0).clamp(0.0, 1.0)
        self.t += 1
        w = 1.0 / (self.t + self.t0)
        self.h_bar = (1 - w) * self.h_bar + w * (self.target - a)
        self.log_h = self.mu - math.sqrt(self.t) / self.gamma * self.h_bar
        eta = self.t ** (-self.kappa)
        self.log_h_avg = eta * self.log_h + (1 - eta) * self.log_h_avg
        return self._out(self.log_h)

    def current(self) -> float | Tensor:
        """The step size to use for the next step (what ``update`` last returned)."""
        return self._out(self.log_h)

    def final(self) -> float | Tensor:
        """The averaged step size to sample with once adaptation ends."""
        return self._out(self.log_h_avg if self.t else self.log_h)

    @staticmethod
    def _out(log_h: Tensor | float) -> float | Tensor:
        if isinstance(log_h, float):
            return math.exp(log_h)
        h = log_h.exp()
        return float(h) if h.dim() == 0 else h


class WelfordVariance:
    """Running mean and variance of draws ``x: (n_chains, *event_shape)``: pooled over chains (one
    estimate of ``event_shape``) or per chain (``(n_chains, *event_shape)``)."""

    def __init__(self, pooled: bool = True) -> None:
        self.pooled = pooled
        self.reset()

    def reset(self) -> None:
        """Forget every draw (a new adaptation window)."""
        self.count = 0
        self.mean: Tensor | None = None
        self.m2: Tensor | None = None

    def update(self, x: Tensor) -> None:
        """Add the draws ``x: (n_chains, *event_shape)`` of one step (computed in float64)."""
        x = x.detach().to(torch.float64)
        if self.pooled:  # every chain is one more draw of a shared distribution
            n_new, mean_new = x.shape[0], x.mean(0)
            m2_new = ((x - mean_new) ** 2).sum(0)
        else:  # one more draw per chain
            n_new, mean_new, m2_new = 1, x, torch.zeros_like(x)
        if self.mean is None:
            self.count, self.mean, self.m2 = n_new, mean_new, m2_new
            return
        total = self.count + n_new
        delta = mean_new - self.mean
        self.mean = self.mean + delta * (n_new / total)
        self.m2 = self.m2 + m2_new + delta**2 * (self.count * n_new / total)
        self.count = total

    def variance(self, regularize: bool = True) -> Tensor:
        """The sample variance; with ``regularize``, Stan's shrinkage ``(n/(n+5))·var + 1e-3·5/(n+5)``."""
        if self.mean is None:
            raise InputError("WelfordVariance needs draws before a variance can be computed.")
        n = self.count
        var = self.m2 / max(n - 1, 1)
        if regularize:
            weight, ridge = stan_shrinkage(n)
            var = weight * var + ridge
        return var


class WelfordCovariance:
    """Running within-chain covariance of draws ``x: (n_chains, *event_shape)`` over the flattened event ``(d,)``.

    Every chain is centred on its own running mean and the chains' scatter matrices are summed: the average of the
    chains' own covariances, what Stan computes from one chain, pooled over chains. Unlike the covariance of all
    draws pooled, it leaves out the spread between chains' means (chains that have not met yet); for mixed chains
    the two agree. Memory ``O(n_chains·d + d²)``; each update costs ``O(n_chains·d²)`` with no host sync.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every draw (a new adaptation window)."""
        self.steps = 0
        self.mean: Tensor | None = None  # (n_chains, d)
        self.m2: Tensor | None = None  # (d, d)

    @property
    def count(self) -> int:
        """The number of draws recorded: steps × chains."""
        return 0 if self.mean is None else self.steps * self.mean.shape[0]

    def update(self, x: Tensor) -> None:
        """Add one draw per chain, ``x: (n_chains, *event_shape)`` (computed in float64)."""
        x = x.detach().flatten(1).to(torch.float64)
        self.steps += 1
        if self.mean is None:
            self.mean, self.m2 = x.clone(), x.new_zeros(x.shape[1], x.shape[1])
            return
        delta = x - self.mean
        self.mean.add_(delta, alpha=1.0 / self.steps)
        self.m2.addmm_(delta.T, delta, alpha=1.0 - 1.0 / self.steps)  # Σ_chains (x − mean_old)(x − mean_new)ᵀ

    def covariance(self, regularize: bool = True) -> Tensor:
        """The within-chain sample covariance ``(d, d)`` (divisor ``n_chains·(steps − 1)``); with ``regularize``,
        Stan's shrinkage toward the identity (:func:`regularize_covariance`, ``n`` = :attr:`count`)."""
        if self.mean is None:
            raise InputError("WelfordCovariance needs draws before a covariance can be computed.")
        cov = self.m2 / max(self.mean.shape[0] * (self.steps - 1), 1)
        return regularize_covariance(cov, self.count) if regularize else cov


def stan_shrinkage(n: int) -> tuple[float, float]:
    """Stan's shrinkage of an estimate from ``n`` draws toward ``1e-3·I``: ``(n/(n+5), 1e-3·5/(n+5))``, the weight of
    the estimate and what is added to its diagonal (stan/mcmc/var_adaptation.hpp, covar_adaptation.hpp)."""
    return n / (n + 5.0), 1e-3 * (5.0 / (n + 5.0))


def regularize_covariance(covariance: Tensor, n: int) -> Tensor:
    """Stan's regularised covariance estimate from ``n`` draws: ``Σ̂ = (n/(n+5))·S + 1e-3·(5/(n+5))·I``
    (Stan's ``covar_adaptation::learn_covariance``, stan/mcmc/covar_adaptation.hpp), ``S: (d, d)``, symmetrised."""
    weight, ridge = stan_shrinkage(n)
    shrunk = (covariance + covariance.T).mul_(0.5 * weight)
    shrunk.diagonal().add_(ridge)
    return shrunk


def low_rank_inverse_mass(covariance: Tensor, rank: int, diagonal: Tensor | None = None) -> InverseMass:
    """The diagonal-plus-rank-``k`` metric of a covariance ``Σ: (d, d)``: ``M⁻¹ = D + D^½·V·diag(γ − 1)·Vᵀ·D^½`` with
    ``(γ, V)`` the ``rank`` largest eigenpairs of the scaled covariance ``D^(−½)·Σ·D^(−½)``; ``diagonal`` ``D: (d,)``
    defaults to ``diag(Σ)`` (the scaled covariance is then the correlation matrix). Exact when ``Σ − D`` has rank
    ``≤ rank`` and is positive semi-definite. Costs one ``O(d³)`` eigendecomposition."""
    _check_rank(rank, covariance.shape[-1])
    scale = (covariance.diagonal() if diagonal is None else diagonal).double().sqrt()
    gamma, vectors = torch.linalg.eigh(covariance.double() / scale[:, None] / scale[None, :])  # ascending
    gamma, vectors = gamma[-rank:], vectors[:, -rank:]
    dtype = covariance.dtype
    return InverseMass.low_rank((scale**2).to(dtype), (vectors * scale[:, None]).to(dtype), (gamma - 1).to(dtype))


def _check_rank(rank: Any, d: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= d - 1:
        raise InputError(
            f"metric='low_rank' needs rank, an integer in [1, d − 1] = [1, {d - 1}] for d = {d}, got {rank!r}; "
            "use metric='dense' for the full covariance."
        )


def stan_windows(n_warmup: int, *, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25) -> list[tuple[int, int]]:
    """Stan's slow adaptation windows ``[(start, end), ...]`` (mass-matrix updates at each ``end``),
    after a fast initial buffer and before a fast terminal buffer; windows double in length.
    Short warm-ups shrink the buffers to 15 % / 10 % as Stan does; below 20 steps there is none."""
    if n_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > n_warmup:
        init_buffer = int(0.15 * n_warmup)
        term_buffer = int(0.1 * n_warmup)
        base_window = n_warmup - init_buffer - term_buffer
    windows = []
    start, size = init_buffer, base_window
    end_slow = n_warmup - term_buffer
    while start < end_slow:
        end = start + size
        if end + 2 * size > end_slow:  # the next window would not fit: stretch this one to the end
            end = end_slow
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


@dataclass(frozen=True)
class WarmupResult:
    """What :func:`warmup` returns: the final states ``x``; ``params``, the sampler's params with the tuned
    ``step_size`` (float if pooled, ``(n_chains,)`` otherwise) and ``inv_mass`` (when adapted) put in; the
    same two as ``step_size`` and ``inv_mass`` (None if not adapted; with ``metric="dense"`` or ``"low_rank"`` the
    mapping of :meth:`~ebm_samplers.InverseMass.tensors`, which ``sample(inv_mass=...)`` takes); the mean acceptance
    statistic of the last 50 warm-up steps; and the ``metric`` adapted."""

    x: Tensor
    params: Any
    step_size: float | Tensor
    inv_mass: Tensor | dict[str, Tensor] | None
    acceptance: float
    metric: str = "diag"

    @property
    def tunables(self) -> dict[str, Any]:
        """The tuned values as ``sample`` keywords: ``step_size`` and, where adapted, ``inv_mass``."""
        return {"step_size": self.step_size, **({"inv_mass": self.inv_mass} if self.inv_mass is not None else {})}


def cannot_warm_up(sampler: Any) -> str | None:
    """Why :func:`warmup` cannot adapt ``sampler`` (None if it can): it needs an ``ebm_samplers`` sampler whose
    info carries an acceptance statistic and whose params have a step size."""
    from ebm_samplers.sampler import AlgorithmSampler

    name = type(sampler).__name__
    if not isinstance(sampler, AlgorithmSampler):
        return (
            f"{name} is a plain ebmcore.Sampler: warm-up adapts the step_size of an ebm_samplers algorithm with "
            "has_acceptance=True to each step's info.acceptance_prob (an info.accepted, which the run's acceptance "
            "counts, is not enough); give step_size yourself, or use MALA, HMC or NUTS."
        )
    if not sampler.algorithm.has_acceptance:
        return f"{name} has no acceptance statistic to adapt a step size to; use MALA, HMC or NUTS."
    if "step_size" not in {f.name for f in dataclasses.fields(sampler.params)}:
        return f"{name} has no step size to adapt; warm up its base sampler instead."
    return None


def warmup(
    sampler: Any,
    x0: Tensor,
    n_warmup: int = 500,
    *,
    target_accept: float = 0.8,
    adapt_step_size: bool = True,
    adapt_mass: bool | None = None,
    pooled: bool = True,
    metric: str = "diag",
    rank: int | None = None,
    generator: torch.Generator | None = None,
) -> WarmupResult:
    """Adapt ``sampler``'s step size (and inverse mass) over ``n_warmup`` steps from ``x0``.

    ``sampler`` is an ``ebm_samplers`` sampler whose ``info`` carries ``acceptance_prob`` (MALA, HMC,
    NUTS). ``adapt_mass`` defaults to whether its params have a mass matrix (HMC, NUTS). Every chain runs
    dual averaging on its own acceptance statistic and Welford's variance on its own draws. ``pooled=True``:
    after each window all chains move with the elementwise median over chains of those variances, and in the
    terminal buffer with one step size, started at the median chain's and adapted to the mean acceptance over
    chains (a float): one set of tunables, which chains that have not yet met the others cannot inflate
    (pooling their draws would fold the spread between chains into the metric).
    ``pooled=False``: each chain keeps its own (``(n_chains,)`` step sizes, ``(n_chains, *event)`` variances).
    ``metric``: ``"diag"`` (the above), ``"dense"`` (after each window ``M⁻¹`` = Stan's regularised within-chain
    covariance of all chains' draws in it, :class:`WelfordCovariance`; wins on correlated targets, costs ``O(d²)``
    per gradient and ``O(d³)`` per window) or ``"low_rank"`` (diagonal plus the top ``rank`` eigenpairs of that
    covariance, :func:`low_rank_inverse_mass`; ``O(d·rank)`` per gradient); both need ``pooled=True``. Returns new
    params (``result.params``): sample with them (``sampler.params = result.params``, or pass
    ``step_size=..., inv_mass=...`` to ``sample``). The sampler object itself is left unchanged.
    """
    why_not = cannot_warm_up(sampler)
    if why_not is not None:
        raise InputError(why_not)
    name = type(sampler).__name__
    fields = {f.name for f in dataclasses.fields(sampler.params)}
    if adapt_mass is None:
        adapt_mass = "inv_mass" in fields
    if not isinstance(n_warmup, int) or n_warmup < 1:
        raise InputError(f"n_warmup must be a positive integer, got {n_warmup!r}.")
    if adapt_mass and "inv_mass" not in fields:
        raise InputError(f"{name} has no mass matrix to adapt; pass adapt_mass=False.")
    check_run_arguments(x0, n_warmup, generator=generator)
    x = sampler.check_initial_state(x0).detach()  # no graph through the warm-up, whatever x0 requires
    check_metric(sampler, metric, rank, event_size(x), adapt_mass=adapt_mass, pooled=pooled)
    params = sampler.resolve(x)
    h0 = params.step_size  # every chain adapts its own step size: a straggler gets the small steps it needs
    h0 = h0.double().cpu().reshape(-1) if isinstance(h0, Tensor) else torch.full((x.shape[0],), h0, dtype=torch.float64)
    averager = DualAveraging(h0, target_accept)
    slow = stan_windows(n_warmup)
    shared_from = (slow[-1][1] if slow else 0) if pooled else n_warmup  # pooled: one step size in the terminal buffer
    welford = WelfordVariance(pooled=False) if metric == "diag" else WelfordCovariance()  # chains that have not met stay apart
    windows = slow if adapt_mass else []
    ends = {end for _, end in windows}
    starts = {start for start, _ in windows}
    inv_mass_tensor: Tensor | dict[str, Tensor] | None = None
    fns = sampler.bind(x)
    state = sampler.algorithm.init(x, fns)
    sampler.check_initial_energy(x, state.energy, getattr(state, "grad", None))
    step = sampler.kernel()
    step_size: float | Tensor = h0
    recent: deque[float] = deque(maxlen=50)
    for i in range(n_warmup):
        if i == shared_from:  # from the median chain's step size (adapted already), to the mean acceptance over chains
            step_size = float(_median_over_chains(averager.current() if adapt_step_size else step_size))
            averager = DualAveraging(step_size, target_accept, explore=shared_from == 0)
        params = with_fields(params, step_size=_to_state(step_size, x))
        state, info = step(state, fns, generator, params)
        stat = info.acceptance_prob
        if adapt_step_size:
            step_size = averager.update(stat if i < shared_from else stat.mean())
        recent.append(float(stat.mean()))
        if i in starts:
            welford.reset()
        if windows and any(s <= i < e for s, e in windows):
            welford.update(state.x)
        if i + 1 in ends:
            adapted = _window_inverse_mass(welford, metric, rank, pooled, x)  # prepared once per window
            inv_mass_tensor = adapted.values if metric == "diag" else adapted.tensors()
            params = with_fields(params, inv_mass=adapted)
            if adapt_step_size:
                averager.restart(averager.current())
    final = averager.final() if adapt_step_size else step_size
    tuned = dataclasses.replace(
        sampler.params, step_size=final, **({"inv_mass": inv_mass_tensor} if inv_mass_tensor is not None else {})
    )
    return WarmupResult(state.x, tuned, final, inv_mass_tensor, sum(recent) / len(recent), metric)


def _window_inverse_mass(
    welford: WelfordVariance | WelfordCovariance, metric: str, rank: int | None, pooled: bool, x: Tensor
) -> InverseMass:
    """The inverse mass of one window's draws, on ``x``'s device and dtype."""
    if isinstance(welford, WelfordVariance):
        variances = welford.variance()
        return as_inverse_mass((_median_over_chains(variances) if pooled else variances).to(dtype=x.dtype, device=x.device), x)
    cov = welford.covariance().to(dtype=x.dtype, device=x.device)
    return InverseMass.dense(cov) if metric == "dense" else low_rank_inverse_mass(cov, rank)


def check_metric(sampler: Any, metric: Any, rank: Any, d: int, *, adapt_mass: bool | None = None, pooled: bool = True) -> None:
    """Refuse a ``metric``/``rank`` that :func:`warmup` cannot adapt for ``sampler`` on ``d``-element states, naming the fix."""
    if adapt_mass is None:
        adapt_mass = "inv_mass" in {f.name for f in dataclasses.fields(sampler.params)}
    if metric not in METRICS:
        raise InputError(f"metric must be one of {', '.join(repr(m) for m in METRICS)}, got {metric!r}.")
    if metric == "low_rank":
        _check_rank(rank, d)
    elif rank is not None:
        raise InputError(f"rank={rank!r} applies to metric='low_rank' only; drop it, or pass metric='low_rank'.")
    if metric != "diag" and "inv_mass" not in {f.name for f in dataclasses.fields(sampler.params)}:
        raise InputError(f"{type(sampler).__name__} has no mass matrix for metric={metric!r}; use HMC or NUTS, or metric='diag'.")
    if metric != "diag" and not adapt_mass:
        raise InputError(f"metric={metric!r} is a mass matrix to adapt, and adapt_mass=False; drop one of them.")
    if metric != "diag" and not pooled:
        raise InputError(f"metric={metric!r} estimates one matrix from every chain's draws; pass pooled=True (the default).")


def _median_over_chains(values: Tensor) -> Tensor:
    """The elementwise median of ``values: (n_chains, ...)`` over chains (the mean of the two middle values for an
    even count): a typical chain's step size or variance, unmoved by a few stragglers or by the spread between
    chains that have not met yet (which pooling the draws of all chains would fold into a variance)."""
    ordered = values.sort(0).values
    m = ordered.shape[0]
    return ordered[m // 2] if m % 2 else (ordered[m // 2 - 1] + ordered[m // 2]) / 2


def _to_state(step_size: float | Tensor, x: Tensor) -> float | Tensor:
    return step_size if not isinstance(step_size, Tensor) else step_size.to(dtype=x.dtype, device=x.device)
