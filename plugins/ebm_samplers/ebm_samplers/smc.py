"""Adaptive tempered sequential Monte Carlo (Del Moral, Doucet & Jasra 2006; Jasra et al. 2011): particles from
``p ∝ exp(−E)`` and the log evidence ``log Z = log ∫ exp(−E(x)) dx``.

``n`` particles start from a normalised base ``q`` and follow ``π_β ∝ q^(1−β)·exp(−β·E)``
(:class:`~ebm_samplers.tempered_path.TemperedEnergy`) from ``β = 0`` to ``1``. Each stage, from particles of ``π_β``
with normalised weights ``W``:

1. **Next temperature.** With ``u = −E − log q`` at the particles, the step ``Δ`` is the one whose incremental
   weights ``w = exp(Δ·u)`` have the conditional ESS ``n·(Σ W·w)² / Σ W·w²`` (Zhou, Johansen & Aston 2016; the
   ESS of ``w`` when ``W`` is uniform, as it is after resampling) equal to ``target_ess·n``. It decreases in ``Δ``, so a
   bisection finds it: 50 halvings of ``[0, 1 − β]``, each one batched over all particles on the device; the
   result is read on the host once per stage (the loop must know when ``β`` reaches 1: this is the stage's
   only host sync besides the check that the weights stay finite). ``Δ`` is at least ``min_step``.
2. **Reweight.** ``log Z += log Σ W·w`` and ``W ∝ W·w``.
3. **Resample** (``resampling``: :mod:`ebm_samplers.resampling`) and **move**: ``n_mcmc_steps`` transitions of a
   registered sampler's kernel (MALA by default, HMC, NUTS, or any algorithm with an acceptance test and a step
   size) that leave ``π_β`` invariant. After each transition the step size is multiplied by
   ``exp(2·(ā − target_accept))``, ``ā`` the transition's mean acceptance probability (a tensor: no host sync; once
   per stage left HMC at 10 % acceptance in 10 dimensions, its estimates biased low); it starts at the kernel's
   default times the base's mean standard deviation.

The run stops after the reweighting that reaches ``β = 1``: the particles come with their normalised weights.

The standard error of ``log Z`` is the perfect-mixing approximation: if each stage's moves gave independent
draws of ``π_β``, the stages' increments would be independent and the relative variance of each the sample
variance of ``w`` over ``n`` (the delta method), which with uniform ``W`` is ``(n/ESS_k − 1)/(n − 1)``; hence
``SE² = Σ_k (n/ESS_k − 1)/(n − 1)``. Moves that mix slowly correlate particles through the resampling genealogy,
and then the true error is larger; independent repeats (different generators) measure it without that assumption.
Like every importance-sampling error, it cannot see a mode that no particle reaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, registry
from ebmcore.energies.binding import bind_energy
from ebmcore.errors import InputError
from ebmcore.validation import check_energy_output, check_gradient_output
from ebm_samplers.algorithm import Algorithm
from ebm_samplers.params import with_fields
from ebm_samplers.resampling import Resampler, get_scheme
from ebm_samplers.tempered_path import Base, GaussianBase, TemperedEnergy

__all__ = ["SMCResult", "adaptive_tempered_smc", "check_options", "default_base", "ess_fraction", "next_step", "next_beta"]

BISECTION_STEPS = 50
"""Halvings of ``[0, 1 − β]`` per stage: the step is found to ``2⁻⁵⁰`` of the remaining interval."""


@dataclass(frozen=True)
class SMCResult:
    """``particles: (n, *event_shape)`` with normalised ``log_weights: (n,)`` (``logsumexp = 0``), approximately from
    ``exp(−E)``; ``log_evidence`` estimates ``log ∫ exp(−E)`` (the base is normalised), ``log_evidence_se`` its
    perfect-mixing standard error (module docstring). Per stage ``k = 1..K``: ``betas`` (``K + 1`` values from 0
    to 1), ``ess`` (after reweighting to ``β_k``), ``log_evidence_increments``; per stage of moves (``K − 1``, at
    ``β_1..β_{K−1}``): ``acceptance`` (mean acceptance probability) and ``step_sizes`` (the step used)."""

    particles: Tensor
    log_weights: Tensor
    log_evidence: float
    log_evidence_se: float
    betas: list[float]
    ess: list[float]
    log_evidence_increments: list[float]
    acceptance: list[float]
    step_sizes: list[float]
    kernel: str
    resampling: str

    @property
    def n_stages(self) -> int:
        """``K``, the number of reweightings."""
        return len(self.betas) - 1

    @property
    def effective_sample_size(self) -> float:
        """The final weights' ESS, ``1 / Σ W²``."""
        return self.ess[-1]

    def summary(self) -> dict[str, Any]:
        """The scalar fields, for a ``metrics.json``."""
        return {
            "log_evidence": self.log_evidence,
            "log_evidence_se": self.log_evidence_se,
            "n_stages": self.n_stages,
            "n_particles": self.particles.shape[0],
            "effective_sample_size": self.effective_sample_size,
            "mean_acceptance": sum(self.acceptance) / len(self.acceptance) if self.acceptance else float("nan"),
            "kernel": self.kernel,
            "resampling": self.resampling,
        }


def ess_fraction(log_w: Tensor, u: Tensor, delta: Tensor) -> Tensor:
    """The conditional ESS over ``n`` of the increments ``exp(delta·u)`` under normalised log weights
    ``log_w: (n,)``: ``(Σ W·w)² / Σ W·w²`` for ``u: (n,)`` and any shape of ``delta`` (one value per element)."""
    d = delta.unsqueeze(-1)
    return torch.exp(2 * torch.logsumexp(log_w + d * u, -1) - torch.logsumexp(log_w + 2 * d * u, -1))


def next_step(log_w: Tensor, u: Tensor, remaining: float, target_ess: float, min_step: float = 0.0) -> Tensor:
    """``Δ`` (a 0-d tensor, on ``u``'s device, no host sync): ``remaining`` if the conditional ESS fraction of the
    whole remaining step is at least ``target_ess``, else the ``Δ`` where it equals ``target_ess`` (bisection,
    :data:`BISECTION_STEPS` halvings, each batched over the particles), at least ``min_step`` and at most ``remaining``."""
    hi = torch.full((), remaining, dtype=u.dtype, device=u.device)
    lo = torch.zeros_like(hi)
    whole_step = ess_fraction(log_w, u, hi) >= target_ess
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok = ess_fraction(log_w, u, mid) >= target_ess
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return torch.where(whole_step, torch.full_like(lo, remaining), lo.clamp(min=min_step, max=remaining))


def next_beta(log_w: Tensor, u: Tensor, beta: float, target_ess: float, min_step: float = 0.0) -> float:
    """The temperature after ``beta`` chosen by :func:`next_step` (one host sync); exactly 1 at the end."""
    delta = float(next_step(log_w, u, 1.0 - beta, target_ess, min_step))
    return 1.0 if delta >= 1.0 - beta else beta + delta


def _algorithm(kernel: "str | Algorithm") -> Algorithm:
    """The algorithm record of a registered sampler name (or ``kernel`` itself), checked for what SMC needs."""
    algorithm = kernel if isinstance(kernel, Algorithm) else getattr(registry.get("sampler", kernel).component, "algorithm", None)
    names = {f.name for f in fields(algorithm.Params)} if isinstance(algorithm, Algorithm) else set()
    if not isinstance(algorithm, Algorithm) or not algorithm.has_acceptance or "step_size" not in names:
        raise InputError(
            f"kernel {kernel!r} cannot move SMC particles: it needs a sampler algorithm with an acceptance "
            "test (so that it leaves each tempered target invariant) and a step_size: mala, hmc or nuts."
        )
    return algorithm


def _acceptance(info: Any) -> Tensor:
    prob = getattr(info, "acceptance_prob", None)
    return (prob if prob is not None else info.accepted).double().mean()


def _positive_int(value: Any, name: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}.")
    return value


def check_options(
    n_particles: int = 1000,
    *,
    kernel: "str | Algorithm" = "mala",
    kernel_params: dict[str, Any] | None = None,
    n_mcmc_steps: int = 5,
    max_stages: int = 1000,
    target_ess: float = 0.5,
    target_accept: float = 0.65,
    min_step: float = 1e-6,
    step_size: float | None = None,
    resampling: "str | Resampler" = "systematic",
) -> tuple[Algorithm, Resampler]:
    """Check :func:`adaptive_tempered_smc`'s options before any work: the kernel's algorithm and the resampling
    scheme, or an :class:`InputError` naming the first option out of its range (``ebm sample`` checks a
    configuration with it before it runs)."""
    _positive_int(n_particles, "n_particles", 2)
    _positive_int(n_mcmc_steps, "n_mcmc_steps", 0)
    _positive_int(max_stages, "max_stages", 1)
    for name, value in (("target_ess", target_ess), ("target_accept", target_accept)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise InputError(f"{name} must be a number in (0, 1), got {value!r}.")
    if isinstance(min_step, bool) or not isinstance(min_step, (int, float)) or not 0 <= min_step < 1:
        raise InputError(f"min_step must be a number in [0, 1), got {min_step!r}.")
    if step_size is not None and not (
        isinstance(step_size, (int, float)) and not isinstance(step_size, bool) and math.isfinite(step_size) and step_size > 0
    ):
        raise InputError(f"step_size must be a positive number, got {step_size!r}.")
    resample = get_scheme(resampling)
    algorithm = _algorithm(kernel)
    if kernel_params is not None and not isinstance(kernel_params, dict):
        raise InputError(f"kernel_params must be a dict of {algorithm.name}'s params, got {kernel_params!r}.")
    known = {f.name for f in fields(algorithm.Params)}
    if unknown := sorted(set(kernel_params or {}) - known):
        raise InputError(
            f"kernel_params: {algorithm.name} has no param(s) {', '.join(unknown)}; its params are {', '.join(sorted(known))}."
        )
    return algorithm, resample


def default_base(
    energy: EnergyModel, loc: Any, scale: Any, event_shape: Sequence[int] | None, dtype: torch.dtype | None, device: Any
) -> GaussianBase:
    """``N(loc, diag(scale²))`` on the energy's event shape (``event_shape`` if given), dtype and device (else float64 on
    CPU): :func:`adaptive_tempered_smc`'s base when it is given none. A ``loc`` or ``scale`` that does not broadcast to
    the event shape raises the ``RuntimeError`` of ``Tensor.expand``."""
    shape = tuple(event_shape) if event_shape is not None else energy.event_shape
    if shape is None:
        raise InputError(f"{type(energy).__name__} sets no event_shape: pass event_shape=(d,) (or a base).")
    ref = energy._reference_tensor()
    dtype = dtype or (ref.dtype if ref is not None else torch.float64)
    device = torch.device(device) if device is not None else (ref.device if ref is not None else torch.device("cpu"))
    return GaussianBase.like(loc, scale, shape, dtype, device)


def _initial_particles(
    energy: EnergyModel, base: Base, n: int, generator: torch.Generator | None
) -> tuple[Tensor, EnergyFunctions, Tensor, Tensor]:
    """``n`` draws ``x: (n, *event_shape)`` from the base, the energy bound at them, ``E(x): (n,)`` and the base's
    ``log q(x): (n,)``; an energy or log density not finite at a draw is an error that says so."""
    owner = type(energy).__name__
    x = base.sample(n, generator)
    energy.validate(x, name="the base's draws")
    fns = bind_energy(energy, x)
    e, g = fns.energy_and_gradient(x)
    check_energy_output(e, x, owner=owner)
    check_gradient_output(g, x, owner=owner)
    log_q = base.log_prob(x)
    bad = int((~torch.isfinite(e) | ~torch.isfinite(log_q)).sum())
    if bad:
        raise InputError(
            f"{owner}'s energy (or the base's log_prob) is not finite at {bad} of {n} initial particles "
            "drawn from the base: tempered SMC needs a base whose draws have finite energy (move or "
            "shrink the base to the energy's domain, or make the energy finite there)."
        )
    return x, fns, e, log_q


def _initial_step_size(x: Tensor, params: Any, step_size: float | None, kernel_params: dict[str, Any] | None) -> Tensor:
    """Each particle's step size ``(n,)``: ``step_size``, else the kernel's given one, else the kernel's default for
    unit scale times the particles' mean standard deviation."""
    n = x.shape[0]
    if step_size is not None:
        return torch.full((n,), float(step_size), dtype=x.dtype, device=x.device)
    if kernel_params and "step_size" in kernel_params:
        return torch.as_tensor(params.step_size, dtype=x.dtype, device=x.device).expand(n).clone()
    return params.step_size * x.flatten(1).std(0).mean().expand(n).clone()


def adaptive_tempered_smc(
    energy: EnergyModel,
    n_particles: int = 1000,
    *,
    base: Base | None = None,
    loc: Any = 0.0,
    scale: Any = 1.0,
    event_shape: Sequence[int] | None = None,
    kernel: "str | Algorithm" = "mala",
    kernel_params: dict[str, Any] | None = None,
    n_mcmc_steps: int = 5,
    step_size: float | None = None,
    target_accept: float = 0.65,
    adapt: bool = True,
    target_ess: float = 0.5,
    resampling: "str | Resampler" = "systematic",
    min_step: float = 1e-6,
    max_stages: int = 1000,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: Any = None,
) -> SMCResult:
    """Adaptive tempered SMC on ``exp(−E)`` with ``n_particles`` (module docstring): the weighted particles and
    ``log Z``.

    ``base``: any normalised density with ``sample(n, generator)`` and ``log_prob(x)``; by default
    ``N(loc, diag(scale²))`` (numbers or tensors broadcasting to ``event_shape``, the energy's by default; dtype and
    device the energy's parameters', else float64 on CPU), which should cover the energy's mass. ``kernel``: a
    registered sampler name (``mala``, ``hmc``, ``nuts``) or an :class:`~ebm_samplers.Algorithm`, with
    ``kernel_params`` for its ``Params`` (e.g. ``{"n_leapfrog_steps": 8}``); ``n_mcmc_steps`` transitions per stage;
    ``step_size`` (default: the kernel's, times the base's mean standard deviation) adapted toward ``target_accept``
    unless ``adapt=False``. ``target_ess`` in ``(0, 1)``: the ESS fraction each stage keeps; ``resampling``:
    ``systematic``, ``stratified``, ``multinomial``, ``residual`` or a function (:mod:`ebm_samplers.resampling`).
    Raises :class:`~ebmcore.errors.InputError` for bad arguments, an energy that is not finite at the base's
    draws, and a run whose ``β`` cannot advance (weights that vanish, or ``max_stages`` reached).
    """
    algorithm, resample = check_options(
        n_particles,
        kernel=kernel,
        kernel_params=kernel_params,
        n_mcmc_steps=n_mcmc_steps,
        max_stages=max_stages,
        target_ess=target_ess,
        target_accept=target_accept,
        min_step=min_step,
        step_size=step_size,
        resampling=resampling,
    )
    n = n_particles
    if base is None:
        base = default_base(energy, loc, scale, event_shape, dtype, device)
    elif not isinstance(base, Base):
        raise InputError(f"base must have sample(n, generator) and log_prob(x), got a {type(base).__name__}.")

    with torch.no_grad():
        x, fns, e, log_q = _initial_particles(energy, base, n, generator)
        tempered = TemperedEnergy(energy, base)
        moves = tempered.bind(x)
        params = algorithm.Params(**(kernel_params or {})).resolve(x)
        step = algorithm.build_kernel(**algorithm.options(tempered))
        h = _initial_step_size(x, params, step_size, kernel_params)

        log_w = torch.full((n,), -math.log(n), dtype=torch.float64, device=x.device)
        beta, betas = 0.0, [0.0]
        ess, increments, acceptance, step_sizes = [], [], [], []
        while True:
            u = -(e.double() + log_q.double())
            remaining = 1.0 - beta
            delta_t = next_step(log_w, u, remaining, target_ess, min_step)
            incremental = log_w + delta_t * u
            increment = torch.logsumexp(incremental, 0)
            delta, finite = torch.stack([delta_t, increment.isfinite().double()]).tolist()  # the stage's one host sync
            new_beta = 1.0 if delta >= remaining else beta + delta
            if not finite:
                raise InputError(
                    f"beta cannot advance from {beta:.6g}: every particle's weight vanishes or is not finite "
                    f"at beta = {new_beta:.6g} (the energy is far from the base's mass, or not finite where "
                    "the moves went): widen or move the base, or use more particles."
                )
            log_w = incremental - increment
            increments.append(increment)
            ess.append(torch.exp(-torch.logsumexp(2 * log_w, 0)))
            beta = new_beta
            betas.append(beta)
            if beta >= 1.0:
                break
            if len(betas) > max_stages:
                raise InputError(
                    f"beta reached only {beta:.6g} after max_stages = {max_stages} stages: raise max_stages, "
                    "lower target_ess, or widen the base toward the energy's mass."
                )
            idx = resample(log_w.exp(), n, generator)
            x, log_w = x[idx], torch.full_like(log_w, -math.log(n))
            if n_mcmc_steps:
                tempered.beta = beta
                state = algorithm.init(x, moves)
                acc = torch.zeros((), dtype=torch.float64, device=x.device)
                step_sizes.append(h[0])
                for _ in range(n_mcmc_steps):
                    state, info = step(state, moves, generator, with_fields(params, step_size=h))
                    a = _acceptance(info)
                    acc = acc + a
                    if adapt:
                        h = h * torch.exp(2.0 * (a - target_accept)).to(h.dtype)
                acceptance.append(acc / n_mcmc_steps)
                x = state.x
            e = fns.energy(x)
            log_q = base.log_prob(x)

    log_evidence = torch.stack(increments).sum()
    ess_t = torch.stack(ess)
    se = torch.sqrt(((n / ess_t - 1) / (n - 1)).clamp(min=0).sum())
    floats = lambda ts: torch.stack(ts).double().tolist() if ts else []
    return SMCResult(
        x,
        log_w,
        float(log_evidence),
        float(se),
        betas,
        ess_t.tolist(),
        floats(increments),
        floats(acceptance),
        floats(step_sizes),
        kernel if isinstance(kernel, str) else kernel.name,
        resampling if isinstance(resampling, str) else getattr(resampling, "__name__", "custom"),
    )
