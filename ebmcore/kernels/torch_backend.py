"""The ``torch`` reference backend: every op in plain PyTorch, on every device and float dtype.

These are the definitions other backends are checked against
(``ebmcore.testing.check_kernel``). All take ``x: (n, d)`` and return energies
``(n,)`` or gradients ``(n, d)`` in ``x``'s dtype; all are differentiable
(``create_graph`` works through them).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ebmcore.kernels.base import Kernel, KernelBackend

__all__ = ["TorchBackend", "add_scaled", "add_scaled_"]

_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_energy(x: Tensor, mean: Tensor, precision: Tensor) -> Tensor:
    """``0.5 (x-m)^T P (x-m)``; ``mean: (d,)``, ``precision: (d, d)`` symmetric."""
    diff = x - mean
    return 0.5 * ((diff @ precision) * diff).sum(-1)


def gaussian_gradient(x: Tensor, mean: Tensor, precision: Tensor) -> Tensor:
    """``P (x-m)`` (``P`` symmetric)."""
    return (x - mean) @ precision


def _mixture_log_components(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    z = (x.unsqueeze(1) - means) / stds  # (n, K, d)
    d = x.shape[-1]
    log_comp = log_weights - stds.log().sum(-1) - 0.5 * d * _LOG_2PI - 0.5 * (z * z).sum(-1)  # (n, K)
    return log_comp, z


def gaussian_mixture_energy(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> Tensor:
    """``-log sum_k w_k N(x; m_k, diag(s_k^2))``; ``means, stds: (K, d)``, ``log_weights: (K,)`` normalised."""
    log_comp, _ = _mixture_log_components(x, means, stds, log_weights)
    return -torch.logsumexp(log_comp, dim=1)


def gaussian_mixture_gradient(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> Tensor:
    """``sum_k r_k(x) (x - m_k) / s_k^2`` with responsibilities ``r_k``."""
    log_comp, z = _mixture_log_components(x, means, stds, log_weights)
    resp = torch.softmax(log_comp, dim=1)
    return torch.einsum("nk,nkd->nd", resp, z / stds)


def double_well_energy(x: Tensor, barrier: float) -> Tensor:
    """``barrier * sum_i (x_i^2 - 1)^2``."""
    t = x * x - 1.0
    return barrier * (t * t).sum(-1)


def double_well_gradient(x: Tensor, barrier: float) -> Tensor:
    """``4 barrier x_i (x_i^2 - 1)``."""
    return (x * x).sub_(1.0).mul_(x).mul_(4.0 * barrier)


def rosenbrock_energy(x: Tensor, a: float, b: float) -> Tensor:
    """``sum_{i<d} b (x_{i+1} - x_i^2)^2 + (a - x_i)^2``."""
    head, tail = x[:, :-1], x[:, 1:]
    t = tail - head * head
    u = a - head
    return (b * t * t + u * u).sum(-1)


def rosenbrock_gradient(x: Tensor, a: float, b: float) -> Tensor:
    head, tail = x[:, :-1], x[:, 1:]
    t = tail - head * head
    grad = torch.zeros_like(x)
    grad[:, :-1] = -4.0 * b * head * t - 2.0 * (a - head)
    grad[:, 1:] += 2.0 * b * t
    return grad


def harmonic_energy(x: Tensor, center: Tensor, stiffness: float) -> Tensor:
    """``0.5 k |x - c|^2``; ``center: (d,)``."""
    diff = x - center
    return 0.5 * stiffness * (diff * diff).sum(-1)


def harmonic_gradient(x: Tensor, center: Tensor, stiffness: float) -> Tensor:
    grad = x - center
    return grad if stiffness == 1.0 else grad.mul_(stiffness)


def ackley_energy(x: Tensor, a: float, b: float, c: float) -> Tensor:
    """``-a exp(-b sqrt(mean x^2)) - exp(mean cos(c x)) + a + e``."""
    r = (x * x).mean(-1).sqrt()
    return -a * torch.exp(-b * r) - torch.exp(torch.cos(c * x).mean(-1)) + a + math.e


def ackley_gradient(x: Tensor, a: float, b: float, c: float) -> Tensor:
    """Analytic gradient; at ``x = 0`` the radial term's (sub)gradient is taken as 0."""
    d = x.shape[-1]
    r = (x * x).mean(-1, keepdim=True).sqrt()
    radial = (a * b / d) * torch.exp(-b * r) / r.clamp_min(torch.finfo(x.dtype).tiny)
    periodic = (c / d) * torch.exp(torch.cos(c * x).mean(-1, keepdim=True))
    return radial * x + periodic * torch.sin(c * x)


def rastrigin_energy(x: Tensor, amplitude: float) -> Tensor:
    """``A d + sum_i x_i^2 - A cos(2 pi x_i)``."""
    d = x.shape[-1]
    return amplitude * d + (x * x - amplitude * torch.cos(2.0 * math.pi * x)).sum(-1)


def rastrigin_gradient(x: Tensor, amplitude: float) -> Tensor:
    return 2.0 * x + (2.0 * math.pi * amplitude) * torch.sin(2.0 * math.pi * x)


def add_scaled(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    """``x + alpha·y`` in one kernel in eager mode.

    Under ``torch.compile`` it is written as a multiply: inductor (torch 2.13) drops ``alpha`` when
    it merges an ``add`` whose ``y`` is a matrix product into ``addmm`` (pytorch/pytorch#167313,
    #196577), which made compiled samplers step by ``+∇E`` instead of ``−h∇E``.
    """
    return x + y * alpha if torch.compiler.is_compiling() else torch.add(x, y, alpha=alpha)


def add_scaled_(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    """In place ``x += alpha·y`` (see :func:`add_scaled` for why compiled code multiplies)."""
    return x.add_(y * alpha) if torch.compiler.is_compiling() else x.add_(y, alpha=alpha)


def langevin_step(x: Tensor, grad: Tensor, noise: Tensor, step_size: float | Tensor, noise_scale: float | Tensor) -> Tensor:
    """``x − step_size·grad + noise_scale·noise``: one Euler–Maruyama step of overdamped Langevin dynamics.

    ``step_size`` and ``noise_scale`` are floats or tensors broadcastable to ``x`` (per chain: ``(n, 1)``).
    """
    if isinstance(step_size, float) and isinstance(noise_scale, float):
        return add_scaled_(add_scaled(x, grad, -step_size), noise, noise_scale)
    return x - step_size * grad + noise_scale * noise


_FUNCTIONS = [
    langevin_step,
    gaussian_energy,
    gaussian_gradient,
    gaussian_mixture_energy,
    gaussian_mixture_gradient,
    double_well_energy,
    double_well_gradient,
    rosenbrock_energy,
    rosenbrock_gradient,
    harmonic_energy,
    harmonic_gradient,
    ackley_energy,
    ackley_gradient,
    rastrigin_energy,
    rastrigin_gradient,
]


class TorchBackend(KernelBackend):
    """Pure PyTorch: runs on every device and float dtype; priority 0, so any faster kernel wins."""

    def __init__(self) -> None:
        super().__init__(
            "torch",
            [Kernel(op=f.__name__, fn=f, device_types=("cpu", "cuda", "mps", "xpu", "meta"), priority=0) for f in _FUNCTIONS],
            description="pure PyTorch reference implementations",
        )
