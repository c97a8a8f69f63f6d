"""MEADS, Maximum-Eigenvalue Adaptation of Damping and Step size (Hoffman & Sountsov 2022, Algorithm 3): the step
size, damping and diagonal preconditioner of generalized HMC (:mod:`ebm_samplers.meads`) for many chains, each fold
of chains tuned from another fold's current states. There is no tuning loop of its own (no dual averaging, no
learning rate): the parameters are functions of the ensemble, recomputed at every iteration.

The ``n`` chains are split at random into ``K = n_folds`` folds (sizes differing by at most one, each of at least 2
chains), shuffled again every ``K`` iterations. At iteration ``t = 1, 2, ...`` fold ``t mod K`` is frozen, and every
other fold ``k`` takes one GHMC step with parameters computed from fold ``k − 1 (mod K)``'s states ``x_j`` and
gradients ``g_j = ∇E(x_j)/T`` (:func:`fold_parameters`):

- **the preconditioner** ``σ``: the fold's per-coordinate standard deviation (``M⁻¹ = diag(σ²)``);
- **the step size** ``h = min(1, c/√λ_g)``, ``c = step_size_multiplier`` (0.5), where ``λ_g`` estimates the largest
  eigenvalue of ``E[(σ∘g)(σ∘g)ᵀ]``, which for a Gaussian is the preconditioned Hessian ``diag(σ)·Σ⁻¹·diag(σ)``:
  leapfrog is stable below ``h = 2/√λ``, and ``h`` stays a quarter of that;
- **the damping** ``γ = max(1/√λ_x, s/(t·h))``, ``s = damping_slowdown`` (1), where ``λ_x`` estimates the largest
  eigenvalue of the covariance of ``(x − x̄)/σ``: ``1/√λ_x`` is the inverse of the largest preconditioned scale, the
  damping that lets the momentum persist for about the time the slowest direction takes to cross the target. The
  floor ``s/(t·h)`` damps heavily while the chains are still far from the target (early ``t``);
- ``α = 1 − exp(−2hγ)`` and the slice shift ``δ = α/2`` follow in the kernel.

Both eigenvalues are the paper's estimate from ``m`` vectors ``z_j``, gradient based, with no Hessian and no power
iteration: ``λ ≈ tr(C²)/tr(C)`` for ``C = E[zzᵀ]``, ``tr(C) ≈ mean_j ‖z_j‖²`` and ``tr(C²) ≈ mean_{i≠j} (z_i·z_j)²``
(both unbiased; :func:`maximum_eigenvalue`). ``tr(C²)/tr(C) = Σλ²/Σλ`` lies between the mean and the largest
eigenvalue, and is the largest where one dominates.

Why every iteration is a valid MCMC step of the whole ensemble: fold ``k``'s kernel depends on fold ``k − 1``'s
states only, never on its own, so it leaves ``π`` of fold ``k`` invariant given the others; the frozen fold breaks
the cycle of dependencies, so the parallel update equals updating the folds one after another (``k = t−1, t−2, ...,
t+1``), each from a predecessor not yet moved; and a shuffle of chains between folds keeps the product ``π^n``.
After the warm-up, :func:`meads_warmup` freezes one set of parameters computed from all chains.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore.sampler import check_run_arguments
from ebm_samplers.meads import MEADSSampler, Params, State
from ebm_samplers.params import InverseMass, with_fields

__all__ = ["maximum_eigenvalue", "fold_parameters", "ensemble_parameters", "MEADSWarmupResult", "meads_warmup"]


def maximum_eigenvalue(z: Tensor) -> Tensor:
    """The estimate ``tr(C²)/tr(C)`` of the largest eigenvalue of ``C = E[zzᵀ]`` from ``z: (m, d)``, ``m >= 2``
    (module docstring), 0-d: ``‖v‖²`` for ``z_j = ±v``; 0/0 (NaN) if every ``z_j`` is 0."""
    s = z @ z.T
    m = z.shape[0]
    square = s.diagonal().square().sum()
    return (s.square().sum() - square) / (m * (m - 1)) / s.diagonal().mean()


def fold_parameters(
    x: Tensor, grad: Tensor, iteration: int, step_size_multiplier: float = 0.5, damping_slowdown: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """The GHMC parameters a fold takes from another fold's states ``x: (m, d)`` and gradients of ``E/T`` like ``x``,
    at ``iteration`` ``t >= 1`` (module docstring): ``(h, γ, σ)``, 0-d, 0-d and ``(d,)``. A coordinate with no spread
    (``σ = 0``) gets ``σ = 1``; a step size with no curvature to bound it is 1."""
    sigma = x.std(0)
    sigma = torch.where(torch.isfinite(sigma) & (sigma > 0), sigma, torch.ones((), dtype=sigma.dtype, device=sigma.device))
    lam_g = maximum_eigenvalue(grad * sigma)
    h = torch.where(lam_g > 0, step_size_multiplier * lam_g.rsqrt(), 1.0).clamp(max=1.0)
    lam_x = maximum_eigenvalue((x - x.mean(0)) / sigma)
    gamma = torch.where(lam_x > 0, lam_x.rsqrt(), 0.0).clamp(min=0).maximum(damping_slowdown / (iteration * h))
    return h, gamma, sigma


def ensemble_parameters(
    x: Tensor,
    grad: Tensor,
    folds: list[Tensor],
    iteration: int,
    step_size_multiplier: float = 0.5,
    damping_slowdown: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every chain's parameters at ``iteration`` from the states ``x: (n, d)`` and gradients of ``E/T`` like ``x``:
    the chains of ``folds[k]`` (index tensors that partition ``range(n)``) take :func:`fold_parameters` of
    ``folds[k − 1]`` (cyclically), never of their own. Returns per chain ``(h, γ, σ)``: ``(n,)``, ``(n,)``, ``(n, d)``."""
    n = x.shape[0]
    step_sizes = torch.empty(n, dtype=x.dtype, device=x.device)
    dampings = torch.empty_like(step_sizes)
    scales = torch.empty_like(x)
    for k, chains in enumerate(folds):
        source = folds[k - 1]
        h, gamma, sigma = fold_parameters(x[source], grad[source], iteration, step_size_multiplier, damping_slowdown)
        step_sizes[chains] = h
        dampings[chains] = gamma
        scales[chains] = sigma
    return step_sizes, dampings, scales


@dataclass(frozen=True)
class MEADSWarmupResult:
    """What :func:`meads_warmup` returns: the final states ``x`` and the full GHMC ``state`` (momentum and slice
    variable included); ``params``, the sampler's params with the frozen ``step_size``, ``damping`` and ``inv_mass``
    (``σ²``, event-shaped) put in, computed from all chains at the end; the mean acceptance probability of the moving
    chains over the last 50 iterations; the gradient evaluations per chain of the whole warm-up (frozen folds
    included: they are computed and discarded); and, per iteration, the mean over all chains (the frozen fold's
    included) of the step size and of the damping."""

    x: Tensor
    state: State
    params: Params
    step_size: float
    damping: float
    inv_mass: Tensor
    acceptance: float
    n_gradient_evaluations: int
    step_sizes: list[float]
    dampings: list[float]

    @property
    def tunables(self) -> dict[str, Any]:
        """The frozen values as ``sample`` keywords: ``step_size``, ``damping`` and ``inv_mass``."""
        return {"step_size": self.step_size, "damping": self.damping, "inv_mass": self.inv_mass}


def _check(value: Any, name: str, ok: bool, what: str) -> None:
    if isinstance(value, bool) or not ok:
        raise InputError(f"{name} must be {what}, got {value!r}.")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _merge(moving: Tensor, new: State, old: State) -> State:
    """``new`` for the ``moving: (n,)`` chains, ``old`` for the frozen ones."""
    fields = {}
    for f in dataclasses.fields(State):
        a, b = getattr(new, f.name), getattr(old, f.name)
        fields[f.name] = torch.where(moving.view(-1, *([1] * (a.dim() - 1))), a, b)
    return State(**fields)


def meads_warmup(
    sampler: MEADSSampler,
    x0: Tensor,
    n_warmup: int = 500,
    *,
    n_folds: int = 4,
    step_size_multiplier: float = 0.5,
    damping_slowdown: float = 1.0,
    generator: torch.Generator | None = None,
) -> MEADSWarmupResult:
    """Run ``n_warmup`` MEADS iterations of the chains ``x0: (n_chains, *event_shape)`` split into ``n_folds >= 2``
    folds of at least 2 chains each (module docstring), then freeze one step size, damping and diagonal ``inv_mass``
    computed from all chains.

    ``step_size_multiplier`` ``c`` in ``(0, 2)``: ``h = min(1, c/√λ)`` (2 is leapfrog's stability limit on a
    Gaussian); ``damping_slowdown`` ``s > 0``: the damping floor ``s/(t·h)`` of iteration ``t``. The sampler's
    ``nonreversible``, ``slice_shift``, temperature (a number) and integrator are kept; its ``step_size``, ``damping``
    and ``inv_mass`` are not used (MEADS sets them). Returns a :class:`MEADSWarmupResult`: sample with
    ``sampler.sample(result.x, n, **result.tunables)`` (or ``sampler.params = result.params``). The sampler itself is
    left unchanged. A non-finite state, energy or gradient at ``x0`` raises a
    :class:`~ebmcore.errors.NonFiniteError` naming the chains.
    """
    if not isinstance(sampler, MEADSSampler):
        raise InputError(
            f"meads_warmup tunes a MEADSSampler (generalized HMC), got {type(sampler).__name__}; "
            "use ebm_samplers.warmup for MALA, HMC or NUTS, chees_warmup for ChEES."
        )
    _check(n_warmup, "n_warmup", isinstance(n_warmup, int) and n_warmup >= 1, "a positive integer")
    _check(n_folds, "n_folds", isinstance(n_folds, int) and n_folds >= 2, "an integer >= 2 (one fold tunes another)")
    ok = _positive(step_size_multiplier) and step_size_multiplier < 2
    _check(step_size_multiplier, "step_size_multiplier", ok, "a number in (0, 2)")
    _check(damping_slowdown, "damping_slowdown", _positive(damping_slowdown), "a finite positive number")
    check_run_arguments(x0, n_warmup, generator=generator)
    x = sampler.check_initial_state(x0).detach()  # no graph through the warm-up, whatever x0 requires
    n = x.shape[0]
    if n < 2 * n_folds:
        raise InputError(
            f"meads_warmup needs at least 2 chains per fold (a fold's spread sets another's scales): {n_folds} folds "
            f"need {2 * n_folds} chains, got {n}; run many chains, e.g. x0 of shape (128, d)."
        )
    params = sampler.resolve(x)
    if isinstance(params.temperature, Tensor):
        raise InputError("MEADS pools chains across folds: give temperature as a number, the same for all chains.")
    fns = sampler.bind(x)
    state = sampler.algorithm.init(x, fns)
    sampler.check_initial_energy(x, state.energy, state.grad)
    step = sampler.kernel()

    device = x.device
    beta = 1.0 / params.temperature
    history = torch.empty(n_warmup, 3, dtype=torch.float64, device=device)  # step size, damping, acceptance
    folds: list[Tensor] = []
    for t in range(1, n_warmup + 1):
        if (t - 1) % n_folds == 0:  # a new random split every K iterations
            drawn_on = generator.device if generator is not None else device
            folds = list(torch.randperm(n, generator=generator, device=drawn_on).to(device).tensor_split(n_folds))
        step_sizes, dampings, scales = ensemble_parameters(
            state.x.flatten(1), state.grad.flatten(1) * beta, folds, t, step_size_multiplier, damping_slowdown
        )
        moving = torch.ones(n, dtype=torch.bool, device=device)
        moving[folds[t % n_folds]] = False
        variances = scales.square().view_as(x)
        metric = InverseMass("diagonal", variances, variances.rsqrt())  # finite and positive by construction: no check
        new, info = step(state, fns, generator, with_fields(params, step_size=step_sizes, damping=dampings, inv_mass=metric))
        state = _merge(moving, new, state)
        accept = torch.where(moving, info.acceptance_prob, 0).sum() / moving.sum()
        history[t - 1] = torch.stack([step_sizes.mean(), dampings.mean(), accept.to(x.dtype)])

    xs, gs = state.x.flatten(1), state.grad.flatten(1) * beta
    h, gamma, sigma = fold_parameters(xs, gs, n_warmup, step_size_multiplier, damping_slowdown)
    h, gamma = float(h), float(gamma)  # the one host sync, with the history's below
    inv_mass = sigma.square().view(x.shape[1:])
    rows = history.tolist()
    tuned = dataclasses.replace(sampler.params, step_size=h, damping=gamma, inv_mass=inv_mass)
    recent = [r[2] for r in rows[-50:]]
    evaluations = n_warmup * info.n_gradient_evaluations
    acceptance = sum(recent) / len(recent)
    hs, gammas = [r[0] for r in rows], [r[1] for r in rows]
    return MEADSWarmupResult(state.x, state, tuned, h, gamma, inv_mass, acceptance, evaluations, hs, gammas)
