"""ChEES adaptation (Hoffman, Radul & Sountsov 2021): one step size and one trajectory length for many chains of
jittered HMC (:mod:`ebm_samplers.chees`), tuned together during warm-up, then frozen.

Every warm-up iteration runs all chains one jittered HMC step with ``L = max(1, ⌈u·T/h⌉)`` and then updates:

- **The step size** ``h``, by dual averaging (:class:`~ebm_samplers.adaptation.DualAveraging`) of ``log h`` toward
  the target acceptance (0.651 by default, optimal for HMC in high dimension, Beskos et al. 2013) of the *harmonic*
  mean over the chains of the acceptance probability (divergent chains left out): a few chains that reject
  everything pull it down, so no chain is left stuck.
- **The trajectory length** ``T``, by gradient ascent in ``log T`` on the ChEES criterion, the change in the
  estimator of the expected square, ``ChEES = ¼·E[(‖x' − E x‖² − ‖x − E x‖²)²]``, ``x`` the chain's state and ``x'``
  the proposal. Along the trajectory ``∂x'/∂t = v' = M⁻¹p'`` and ``t = u·T``, so chain ``m`` estimates
  ``∂ChEES/∂log T`` by ``g_m = u·T·(‖x'_m − x̄'‖² − ‖x_m − x̄‖²)·⟨x'_m − x̄', v'_m⟩`` with ``x̄`` the chains' mean and
  ``x̄'`` the proposals' mean weighted by acceptance probability (:func:`chees_gradient`). The estimate is
  ``g = Σ α_m g_m / Σ α_m``, a chain's weight its acceptance probability ``α_m`` (0 where it diverged). ``log T``
  takes a step of Adam without momentum (``β₁ = 0``, ``β₂ = 0.95``, learning rate 0.025; :class:`Adam`), clipped to
  ``±0.35``. ``T`` is kept in ``[h, leapfrog_limit·h]``.

After warm-up, ``h`` is dual averaging's averaged step size and ``T`` the iterate average of ``log T`` with weights
``k^(−1/2)`` (iteration ``k``). On a Gaussian with scales ``σ_i`` and identity mass, exact dynamics give
``ChEES(T) ∝ Σ σ_i⁴·E_u[sin²(u·T/σ_i)] = Σ σ_i⁴·(½ − sin(2T/σ_i)/(4T/σ_i))``, ``u ~ U(0, 1)``: the largest scale
dominates and the optimum is ``T ≈ 2.25·σ_max`` (where ``tan(2T/σ) = 2T/σ``). The harmonic mean, the gradient
estimate and their finiteness are read on the host once per iteration (one sync).

This is the paper's Algorithm 1 as its authors' implementation runs it (TFP's
``GradientBasedTrajectoryLengthAdaptation``: the warm-up runs the Adam iterate of ``T``, and the ``k^(−1/2)`` iterate
average is kept for sampling only). BlackJAX's ``chees_adaptation`` differs: it runs, and takes Adam's step from,
the running average itself, clipped to ``T ≥ h``, so after dual averaging's first jump (``h ≈ 4.4`` on W3C's
``N(0, I_20)``) its ``T`` starts at 4.4 and decays at the averaging's pace (1.82 at iteration 10, 1.69 at 200),
above the criterion's maximum for the leapfrog steps that run: with ``L = ⌈u·T/h⌉`` and ``h ≈ 0.73`` the expected
``sin²`` of the angle turned is largest near ``T = 2h`` (about 1.47, where this warm-up ends).
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
from ebm_samplers.adaptation import DualAveraging
from ebm_samplers.chees import ChEESSampler, Params
from ebm_samplers.params import with_fields

__all__ = ["TARGET_ACCEPT", "Adam", "chees_gradient", "harmonic_acceptance", "ChEESWarmupResult", "chees_warmup"]

TARGET_ACCEPT = 0.651
"""The default target of the harmonic-mean acceptance (Beskos et al. 2013, as in the paper)."""


class Adam:
    """Adam without momentum (``β₁ = 0``) on one scalar, *ascending*: ``update(g)`` returns the step
    ``lr·g/√(v̂ + 1e-20)`` clipped to ``±clip``, ``v`` the bias-corrected moving average of ``g²`` (rate ``1 − β₂``)."""

    def __init__(self, learning_rate: float = 0.025, beta2: float = 0.95, clip: float = 0.35) -> None:
        self.learning_rate, self.beta2, self.clip = learning_rate, beta2, clip
        self.v, self.t = 0.0, 0

    def update(self, g: float) -> float:
        """The step for gradient ``g`` (of the criterion to maximise)."""
        self.t += 1
        self.v = self.beta2 * self.v + (1 - self.beta2) * g * g
        v_hat = self.v / (1 - self.beta2**self.t)
        return max(-self.clip, min(self.clip, self.learning_rate * g / math.sqrt(v_hat + 1e-20)))


def harmonic_acceptance(acceptance_prob: Tensor, divergent: Tensor) -> Tensor:
    """The harmonic mean of ``acceptance_prob: (n,)`` over the chains that did not diverge (0-d; NaN if all did)."""
    inverse = acceptance_prob.double().reciprocal().masked_fill_(divergent, 0.0)
    return (divergent.numel() - divergent.sum()) / inverse.sum()


def chees_gradient(
    x: Tensor, proposal: Tensor, velocity: Tensor, acceptance_prob: Tensor, divergent: Tensor, u: float, trajectory_length: float
) -> Tensor:
    """The acceptance-weighted estimate of ``∂ChEES/∂log T`` (module docstring), 0-d float64, from the states before
    the step ``x: (n, *event)``, the proposals and their velocities (like ``x``), ``acceptance_prob`` and ``divergent``
    ``(n,)``, the jitter ``u`` and ``T``. Chains with a non-finite or divergent proposal weigh 0; NaN if all do."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x1, v1 = (t.flatten(1).to(dtype) for t in (proposal, velocity))
    ok = torch.isfinite(torch.linalg.vecdot(x1, v1)).logical_and_(~divergent)  # a NaN or infinite entry of either
    return _gradient(
        x, torch.where(ok[:, None], x1, 0.0), torch.where(ok[:, None], v1, 0.0), acceptance_prob, ~ok, u, trajectory_length
    )


def _gradient(
    x: Tensor, proposal: Tensor, velocity: Tensor, acceptance_prob: Tensor, left_out: Tensor, u: float, trajectory_length: float
) -> Tensor:
    """:func:`chees_gradient` with the chains ``left_out`` weighing 0 and no check of the others' finiteness (a
    non-finite entry among them makes the result non-finite: the warm-up then calls :func:`chees_gradient`). In the
    states' dtype, at least float32 (the states carry no more digits, and the estimate's Monte Carlo error is far
    above float32's rounding), in few passes over ``(n, d)``."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x0, x1, v1 = (t.flatten(1).to(dtype) for t in (x, proposal, velocity))
    w = acceptance_prob.to(dtype).masked_fill(left_out, 0.0)
    total = w.sum()
    d1 = x1 - (w @ x1) / total
    d0 = x0 - x0.mean(0)
    g = (torch.linalg.vecdot(d1, d1) - torch.linalg.vecdot(d0, d0)) * torch.linalg.vecdot(d1, v1)
    return (w @ g).double() * (u * trajectory_length) / total.double()


@dataclass(frozen=True)
class ChEESWarmupResult:
    """What :func:`chees_warmup` returns: the final states ``x``; ``params``, the sampler's params with the tuned
    ``step_size`` and ``max_leapfrog_steps = T/h`` put in; ``step_size`` ``h`` and ``trajectory_length`` ``T``; the
    harmonic-mean acceptance of the last 50 iterations (the statistic adapted); the gradient evaluations per chain of
    the whole warm-up; and, per iteration, the step size and trajectory length it ran with."""

    x: Tensor
    params: Params
    step_size: float
    trajectory_length: float
    acceptance: float
    n_gradient_evaluations: int
    step_sizes: list[float]
    trajectory_lengths: list[float]

    @property
    def max_leapfrog_steps(self) -> float:
        """``N = T/h``, the leapfrog steps of an un-jittered trajectory."""
        return self.trajectory_length / self.step_size

    @property
    def tunables(self) -> dict[str, Any]:
        """The tuned values as ``sample`` keywords: ``step_size`` and ``max_leapfrog_steps``."""
        return {"step_size": self.step_size, "max_leapfrog_steps": self.max_leapfrog_steps}


def _check(value: Any, name: str, ok: bool, what: str) -> None:
    if isinstance(value, bool) or not ok:
        raise InputError(f"{name} must be {what}, got {value!r}.")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def chees_warmup(
    sampler: ChEESSampler,
    x0: Tensor,
    n_warmup: int = 500,
    *,
    target_accept: float = TARGET_ACCEPT,
    learning_rate: float = 0.025,
    initial_trajectory_length: float | None = None,
    leapfrog_limit: int = 1000,
    generator: torch.Generator | None = None,
) -> ChEESWarmupResult:
    """Tune a :class:`~ebm_samplers.ChEESSampler`'s shared step size and trajectory length over ``n_warmup``
    iterations of all chains of ``x0: (n_chains, *event_shape)``, ``n_chains >= 2`` (module docstring).

    ``target_accept`` in ``(0, 1)``: of the harmonic-mean acceptance; ``learning_rate``: Adam's, on ``log T``;
    ``initial_trajectory_length``: where ``T`` starts (default: the initial step size, one leapfrog step, as BlackJAX's
    ``chees_adaptation`` starts: ``T`` then grows to the criterion's first maximum, about ``2.25·σ`` of the widest
    scale; started near a later maximum, as from ``2⌈√d⌉`` steps on a logistic regression, it settles there);
    ``leapfrog_limit``: at most this many steps per trajectory, ``T ≤ leapfrog_limit·h``. The sampler's ``step_size``
    (a number: one for all chains) is where dual averaging starts; its mass matrix, temperature, jitter and integrator
    are kept. Returns a :class:`ChEESWarmupResult`: sample with ``sampler.sample(result.x, n, **result.tunables)`` (or
    ``sampler.params = result.params``). The sampler itself is left unchanged. A non-finite state, energy or gradient
    at ``x0`` raises a :class:`~ebmcore.errors.NonFiniteError` naming the chains.
    """
    if not isinstance(sampler, ChEESSampler):
        raise InputError(
            f"chees_warmup tunes a ChEESSampler (jittered HMC), got {type(sampler).__name__}; "
            "use ebm_samplers.warmup for MALA, HMC or NUTS."
        )
    _check(n_warmup, "n_warmup", isinstance(n_warmup, int) and n_warmup >= 1, "a positive integer")
    _check(target_accept, "target_accept", _number(target_accept) and 0 < target_accept < 1, "a number in (0, 1)")
    _check(learning_rate, "learning_rate", _number(learning_rate) and learning_rate > 0, "a finite positive number")
    _check(leapfrog_limit, "leapfrog_limit", isinstance(leapfrog_limit, int) and leapfrog_limit >= 1, "a positive integer")
    if initial_trajectory_length is not None:
        ok = _number(initial_trajectory_length) and initial_trajectory_length > 0
        _check(initial_trajectory_length, "initial_trajectory_length", ok, "a finite positive number or None")
    check_run_arguments(x0, n_warmup, generator=generator)
    x = sampler.check_initial_state(x0).detach()  # no graph through the warm-up, whatever x0 requires
    if x.shape[0] < 2:
        raise InputError(
            f"chees_warmup needs at least 2 chains (the criterion centres on the mean over chains), got {x.shape[0]}; "
            "run many chains, e.g. x0 of shape (128, d)."
        )
    params = sampler.resolve(x)
    if isinstance(params.step_size, Tensor):
        raise InputError("ChEES adapts one step size shared by all chains; give step_size as a number (or None).")
    fns = sampler.bind(x)
    state = sampler.algorithm.init(x, fns)
    sampler.check_initial_energy(x, state.energy, state.grad)
    step = sampler.kernel()

    h = params.step_size
    log_t = math.log(initial_trajectory_length or h)
    log_t_avg = log_t
    averager, adam = DualAveraging(h, target_accept), Adam(learning_rate)
    recent: deque[float] = deque(maxlen=50)
    step_sizes: list[float] = []
    lengths: list[float] = []
    evaluations = 0
    for k in range(1, n_warmup + 1):
        # the bounds h ≤ T ≤ leapfrog_limit·h apply to the trajectory each iteration runs, not to the optimiser's
        # log T: an early large step size must not push T up for good (to the criterion's second maximum)
        t = math.exp(min(max(log_t, math.log(h)), math.log(leapfrog_limit * h)))
        step_sizes.append(h)
        lengths.append(t)
        x_before = state.x
        state, info = step(state, fns, generator, with_fields(params, step_size=h, max_leapfrog_steps=t / h))
        evaluations += info.n_gradient_evaluations
        stats = torch.stack(
            [
                harmonic_acceptance(info.acceptance_prob, info.divergent),
                _gradient(x_before, info.proposal, info.velocity, info.acceptance_prob, info.divergent, info.jitter, t),
            ]
        )
        accept, g = stats.tolist()  # the iteration's one host sync
        if not math.isfinite(g):  # a non-finite proposal or velocity among the weighted chains: leave it out
            args = (x_before, info.proposal, info.velocity, info.acceptance_prob, info.divergent, info.jitter, t)
            g = float(chees_gradient(*args))
        accept = accept if math.isfinite(accept) else 0.0
        recent.append(accept)
        h = averager.update(accept)
        if math.isfinite(g):
            log_t += adam.update(g)
        w = k**-0.5
        log_t_avg = w * log_t + (1 - w) * log_t_avg

    h = averager.final()
    t = min(max(math.exp(log_t_avg), h), leapfrog_limit * h)
    tuned = dataclasses.replace(sampler.params, step_size=h, max_leapfrog_steps=t / h)
    return ChEESWarmupResult(state.x, tuned, h, t, sum(recent) / len(recent), evaluations, step_sizes, lengths)
