"""Score matching: exact (Hyvärinen 2005), Hutchinson, sliced (Song et al. 2019) and denoising
(Vincent 2011; multi-level as in NCSN, Song & Ermon 2019).

With score ``s = −∇ₓE``, Hyvärinen's objective is ``J = E[½|s|² + tr ∇ₓs] = E[½|∇ₓE|² − tr ∇²ₓE]``;
it equals the Fisher divergence to the data up to a constant. All losses average over the batch
and sum over the event dimensions.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from ebmcore import EnergyModel, Loss
from ebmcore.energies import feedforward
from ebmcore.energies.base import closed_form_program
from ebmcore.errors import InputError
from ebm_losses.network_kernels import kernel_loss, network_kernel
from ebmcore.validation import check_energy_output, check_positive

__all__ = ["ScoreMatching", "SlicedScoreMatching", "DenoisingScoreMatching", "projections"]

PROJECTIONS = ("rademacher", "gaussian", "sphere")


def projections(kind: str, shape: tuple[int, ...], *, like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Random directions ``v`` with ``E[v vᵀ] = I``: Rademacher ±1, standard Gaussian, or uniform on the
    sphere of radius ``√d``. ``shape = (m, *event_shape)``."""
    if kind == "rademacher":
        return torch.randint(0, 2, shape, generator=generator, device=like.device).to(like.dtype).mul_(2).sub_(1)
    v = torch.randn(shape, generator=generator, dtype=like.dtype, device=like.device)
    if kind == "gaussian":
        return v
    if kind == "sphere":
        d = math.prod(shape[1:])
        return v * (math.sqrt(d) / v.flatten(1).norm(dim=1)).view(-1, *([1] * (len(shape) - 1)))
    raise InputError(f"unknown projection {kind!r}; choose one of {', '.join(PROJECTIONS)}.")


def _flat_sum(t: Tensor) -> Tensor:
    return t.flatten(1).sum(1)


def _derivative(total: Tensor, x: Tensor) -> Tensor:
    """``∂ total/∂x`` with its graph, zero where ``total`` does not depend on ``x``: the gradient of an energy linear
    in ``x`` is constant, its Hessian term is zero (autograd would say the input was not used)."""
    if not total.requires_grad:
        return torch.zeros_like(x)
    (d,) = torch.autograd.grad(total, x, create_graph=True, allow_unused=True)
    return torch.zeros_like(x) if d is None else d


def _gradient(energy: EnergyModel, x: Tensor) -> Tensor:
    """``∇ₓE(x)`` with its graph, after checking that ``E(x)`` is ``(n,)``: the gradient of an ``(n, 2)`` or
    reduced energy would be that of its sum, silently."""
    e, grad = energy.compute_energy_and_gradient(x, create_graph=True)
    check_energy_output(e, x, owner=type(energy).__name__)
    return grad


class ScoreMatching(Loss):
    """Hyvärinen's objective ``mean(½|∇ₓE|² − tr ∇²ₓE)``.

    ``method="exact"`` computes the Hessian trace with one backward pass per input dimension
    (use it for low dimensions); ``"hutchinson"`` estimates it as ``vᵀ(∇²E)v`` with ``n_probes``
    Rademacher (or ``probe``) vectors per sample.
    """

    def __init__(self, method: str = "exact", *, n_probes: int = 1, probe: str = "rademacher") -> None:
        if method not in ("exact", "hutchinson"):
            raise InputError(f"method must be 'exact' or 'hutchinson', got {method!r}.")
        if probe not in PROJECTIONS:
            raise InputError(f"unknown probe {probe!r}; choose one of {', '.join(PROJECTIONS)}.")
        if not isinstance(n_probes, int) or n_probes < 1:
            raise InputError(f"n_probes must be a positive integer, got {n_probes!r}.")
        self.method, self.n_probes, self.probe = method, n_probes, probe

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        if self.method == "hutchinson":
            x = data.detach().repeat(self.n_probes, *([1] * (data.dim() - 1))).requires_grad_(True)
            grad = _gradient(energy, x)
            v = projections(self.probe, tuple(x.shape), like=x, generator=generator)
            trace = _flat_sum(_derivative(_flat_sum(grad * v).sum(), x) * v)
        else:
            x = data.detach().requires_grad_(True)
            grad = _gradient(energy, x)
            flat = grad.flatten(1)
            trace = torch.zeros(x.shape[0], dtype=grad.dtype, device=grad.device)
            for i in range(flat.shape[1]):
                trace = trace + _derivative(flat[:, i].sum(), x).flatten(1)[:, i]
        return (0.5 * _flat_sum(grad * grad) - trace).mean()


class SlicedScoreMatching(Loss):
    """Sliced score matching ``mean(−vᵀ(∇²E)v + ½(vᵀ∇E)²)`` over ``n_projections`` directions per sample.

    ``variance_reduction=True`` (SSM-VR) uses ``½|∇E|²``, the exact expectation of ``½(vᵀ∇E)²``.
    ``projection``: ``"rademacher"``, ``"gaussian"`` or ``"sphere"`` (all with ``E[vvᵀ] = I``).
    """

    def __init__(self, n_projections: int = 1, *, projection: str = "rademacher", variance_reduction: bool = False) -> None:
        if not isinstance(n_projections, int) or n_projections < 1:
            raise InputError(f"n_projections must be a positive integer, got {n_projections!r}.")
        if projection not in PROJECTIONS:
            raise InputError(f"unknown projection {projection!r}; choose one of {', '.join(PROJECTIONS)}.")
        self.n_projections, self.projection, self.variance_reduction = n_projections, projection, bool(variance_reduction)

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        x = data.detach()
        if self.n_projections > 1:
            x = x.repeat(self.n_projections, *([1] * (x.dim() - 1)))
        plan = closed_form_program(energy, x)[0]
        if plan is not None:  # ∇E and vᵀ∇²E v by the chain rule: one backward pass for the loss, not three levels
            v = projections(self.projection, tuple(x.shape), like=x, generator=generator)
            plan_loss = lambda: self._value(*feedforward.score_terms(plan, x, v), v)  # noqa: E731
            kernel = None if self.variance_reduction else network_kernel("feedforward_sliced_score_matching", plan, x)
            if kernel is None:
                return plan_loss()
            return kernel_loss(plan, *kernel.fn(x, v, plan), recompute=plan_loss)  # ebm-cuda: loss and gradients natively
        x = x.requires_grad_(True)
        grad = _gradient(energy, x)
        v = projections(self.projection, tuple(x.shape), like=x, generator=generator)
        return self._value(grad, _flat_sum(_derivative(_flat_sum(grad * v).sum(), x) * v), v)

    def _value(self, grad: Tensor, vhv: Tensor, v: Tensor) -> Tensor:
        """``mean(½(vᵀ∇E)² − vᵀ∇²E v)`` (or ``½|∇E|²`` first, with variance reduction) from ``∇E``, ``vᵀ∇²E v: (n,)``."""
        gv = _flat_sum(grad * v)
        second = 0.5 * (_flat_sum(grad * grad) if self.variance_reduction else gv * gv)
        return (second - vhv).mean()


class DenoisingScoreMatching(Loss):
    """Denoising score matching: ``½ mean |∇E(x̃) − ε/σ|²`` with ``x̃ = x + σε``.

    With several ``sigmas`` (NCSN style), each sample gets a level drawn uniformly and the loss is
    weighted by ``σ²``: ``½ mean |σ∇E(x̃) − ε|²``. With ``sigma_range=(low, high)`` each sample's level is
    drawn log-uniformly from that interval (a continuum of levels), with the same weighting. An
    ordinary energy is shared by all levels; a
    noise-conditional one (``noise_conditional = True``) is called as ``compute_energy(x̃, σ)`` with
    ``σ: (n,)``, as an NCSN score model. The optimum of a level is the score of the data smoothed by
    ``N(0, σ²I)``.
    """

    def __init__(
        self, sigma: float | None = 0.1, *, sigmas: Sequence[float] | None = None, sigma_range: Sequence[float] | None = None
    ) -> None:
        if sigma_range is not None:
            if sigmas is not None:
                raise InputError("give sigmas (a list of levels) or sigma_range (low, high), not both.")
            if (
                not isinstance(sigma_range, (list, tuple))
                or len(sigma_range) != 2
                or not (0 < check_positive(sigma_range[0], "sigma_range[0]") < check_positive(sigma_range[1], "sigma_range[1]"))
            ):
                raise InputError(f"sigma_range must be [low, high] with 0 < low < high, got {sigma_range!r}.")
            sigmas = [float(sigma_range[0]), float(sigma_range[1])]
        levels = [sigma] if sigmas is None else list(sigmas) if isinstance(sigmas, (list, tuple, torch.Tensor)) else None
        if not levels or any(s is None for s in levels):
            raise InputError("give sigma, or a non-empty list sigmas, or sigma_range = [low, high].")
        self.sigmas = torch.tensor([check_positive(s, "sigma") for s in levels], dtype=torch.float64)
        self.continuous = sigma_range is not None
        self._span = (min(map(float, self.sigmas)), max(map(float, self.sigmas)))  # Python floats: no sync per call

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        x = data.detach()
        root = math.sqrt(torch.finfo(x.dtype).max)  # ε/σ, σ∇E and their squares must not overflow the data's dtype
        if not 1e3 / root <= self._span[0] <= self._span[1] <= 1e-3 * root:
            raise InputError(
                f"sigma must lie in [{1e3 / root:.3g}, {1e-3 * root:.3g}] for {x.dtype} data (the loss squares "
                f"ε/σ and σ∇E), got {self._span[0]:.3g} to {self._span[1]:.3g}."
            )
        eps = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        single = self.sigmas.numel() == 1
        conditional = getattr(energy, "noise_conditional", False)
        sigma: Tensor | None = None  # per sample, (n,)
        if self.continuous:  # log-uniform on [low, high]
            low, high = self._span
            u = torch.rand((x.shape[0],), generator=generator, dtype=x.dtype, device=x.device)
            sigma = (math.log(low) + u * math.log(high / low)).exp()
        elif single:  # the one level, a float; a tensor of it only where E(x, σ) takes one or the dtype rounds it
            if conditional or x.dtype not in (torch.float32, torch.float64):
                sigma = torch.full((x.shape[0],), self._span[0], dtype=x.dtype, device=x.device)
        else:
            idx = torch.randint(0, self.sigmas.numel(), (x.shape[0],), generator=generator, device=x.device)
            sigma = self.sigmas.to(dtype=x.dtype, device=x.device)[idx]
        # a Python float σ gives x + σε and ε/σ to the bit as a float32 or float64 tensor of it does
        sigma_b = self._span[0] if sigma is None else sigma.view(-1, *([1] * (x.dim() - 1)))
        noisy = x + sigma_b * eps
        plan = None if conditional else closed_form_program(energy, noisy)[0]
        if plan is not None:  # ∇E by the chain rule, differentiable in θ: one backward pass for the loss
            plan_loss = lambda: self._value(feedforward.score_terms(plan, noisy)[0], eps, sigma_b)  # noqa: E731
            kernel = network_kernel("feedforward_denoising_score_matching", plan, noisy)
            if kernel is None:
                return plan_loss()
            return kernel_loss(
                plan, *kernel.fn(noisy, eps / sigma_b if single else eps, None if single else sigma, plan), recompute=plan_loss
            )  # ebm-cuda: the loss and its weight gradients natively
        if conditional:  # E(x, σ), as annealed Langevin samples it
            noisy.requires_grad_(True)
            e = check_energy_output(energy.compute_energy(noisy, sigma), noisy, owner=type(energy).__name__)
            (grad,) = torch.autograd.grad(e.sum(), noisy, create_graph=True)
        else:
            grad = _gradient(energy, noisy.requires_grad_(True))
        return self._value(grad, eps, sigma_b)

    def _value(self, grad: Tensor, eps: Tensor, sigma_b: Tensor | float) -> Tensor:
        """One level: ``½ mean |∇E − ε/σ|²``; several: weighted by ``σ²``, ``½ mean |σ∇E − ε|²`` (the same at one
        level, times σ²)."""
        residual = grad - eps / sigma_b if self.sigmas.numel() == 1 else sigma_b * grad - eps
        return 0.5 * _flat_sum(residual * residual).mean()
