"""Classic test landscapes: double well, Rosenbrock, harmonic, Ackley, Rastrigin, with their parameter
tables and ``torch`` reference kernels.

They hold no tensor parameters (except the harmonic center), so they accept
inputs of any float dtype on any device.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.params import scalar, vector
from ebmcore.errors import InputError
from ebmcore.validation import check_placement, parameter_tensor

__all__ = ["DoubleWellEnergy", "RosenbrockEnergy", "HarmonicEnergy", "AckleyEnergy", "RastriginEnergy"]


class DoubleWellEnergy(AnalyticEnergy):
    """``E(x) = barrier · Σᵢ (xᵢ² − 1)²``: modes at ``xᵢ = ±1`` in every coordinate."""

    op = "double_well"
    params = (scalar("barrier", 1.0, positive=True),)
    sample_scale = 1.5

    def __init__(self, dim: int = 2, barrier: float = 1.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.set_parameters(barrier=barrier)

    @staticmethod
    def reference_energy(x: Tensor, barrier: float) -> Tensor:
        """``barrier * sum_i (x_i^2 - 1)^2``: ``(n,)``."""
        t = x * x - 1.0
        return barrier * (t * t).sum(-1)

    @staticmethod
    def reference_gradient(x: Tensor, barrier: float) -> Tensor:
        """``4 barrier x_i (x_i^2 - 1)``: ``(n, d)``."""
        return (x * x).sub_(1.0).mul_(x).mul_(4.0 * barrier)


class RosenbrockEnergy(AnalyticEnergy):
    """``E(x) = Σ_{i<d} b (x_{i+1} − xᵢ²)² + (a − xᵢ)²``: a curved valley; with the default ``a = 1`` the
    global minimum ``E = 0`` is at ``(1, …, 1)``."""

    op = "rosenbrock"
    params = (scalar("a", 1.0), scalar("b", 100.0, positive=True))
    min_dim = 2
    sample_scale = 1.5

    def __init__(self, dim: int = 2, a: float = 1.0, b: float = 100.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.set_parameters(a=a, b=b)

    @staticmethod
    def reference_energy(x: Tensor, a: float, b: float) -> Tensor:
        """``sum_{i<d} b (x_{i+1} - x_i^2)^2 + (a - x_i)^2``: ``(n,)``."""
        head, tail = x[:, :-1], x[:, 1:]
        t = tail - head * head
        u = a - head
        return (b * t * t + u * u).sum(-1)

    @staticmethod
    def reference_gradient(x: Tensor, a: float, b: float) -> Tensor:
        """``−4b xᵢ (xᵢ₊₁ − xᵢ²) − 2(a − xᵢ)`` (for ``i < d``) plus ``2b (xᵢ − xᵢ₋₁²)`` (for ``i > 0``): ``(n, d)``."""
        head, tail = x[:, :-1], x[:, 1:]
        t = tail - head * head
        grad = torch.zeros_like(x)
        grad[:, :-1] = -4.0 * b * head * t - 2.0 * (a - head)
        grad[:, 1:] += 2.0 * b * t
        return grad


class HarmonicEnergy(AnalyticEnergy):
    """``E(x) = ½ k |x − c|²``: an isotropic Gaussian with variance ``1/k`` around ``center``."""

    op = "harmonic"
    params = (vector("center"), scalar("stiffness", 2.5, positive=True))

    def __init__(
        self,
        dim: int = 2,
        stiffness: float = 1.0,
        center: Any = None,
        *,
        dtype: torch.dtype | None = None,
        device: Any = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(dim, backend)
        dtype, device = check_placement(dtype, device, "HarmonicEnergy")
        c = torch.zeros(dim, dtype=dtype, device=device) if center is None else parameter_tensor(center, "center", dtype, device)
        if c.shape != (dim,):
            raise InputError(f"HarmonicEnergy: center must be {dim} finite numbers, shape ({dim},); got shape {tuple(c.shape)}.")
        self.set_parameters(center=c, stiffness=stiffness)

    @staticmethod
    def reference_energy(x: Tensor, center: Tensor, stiffness: float) -> Tensor:
        """``0.5 k |x - c|^2``; ``center: (d,)``: ``(n,)``."""
        diff = x - center
        return 0.5 * stiffness * (diff * diff).sum(-1)

    @staticmethod
    def reference_gradient(x: Tensor, center: Tensor, stiffness: float) -> Tensor:
        """``k (x - c)``: ``(n, d)``."""
        grad = x - center
        return grad if stiffness == 1.0 else grad.mul_(stiffness)


class AckleyEnergy(AnalyticEnergy):
    """Ackley's function: ``−a exp(−b √(mean x²)) − exp(mean cos(c x)) + a + e``; many local minima, global at 0."""

    op = "ackley"
    params = (scalar("a", 20.0), scalar("b", 0.2, positive=True), scalar("c", 2 * math.pi))
    sample_scale = 1.5

    def __init__(
        self, dim: int = 2, a: float = 20.0, b: float = 0.2, c: float = 2 * math.pi, *, backend: str | None = None
    ) -> None:
        super().__init__(dim, backend)
        self.set_parameters(a=a, b=b, c=c)

    @staticmethod
    def reference_energy(x: Tensor, a: float, b: float, c: float) -> Tensor:
        """``-a exp(-b sqrt(mean x^2)) - exp(mean cos(c x)) + a + e``: ``(n,)``."""
        r = (x * x).mean(-1).sqrt()
        return -a * torch.exp(-b * r) - torch.exp(torch.cos(c * x).mean(-1)) + a + math.e

    @staticmethod
    def reference_gradient(x: Tensor, a: float, b: float, c: float) -> Tensor:
        """Analytic gradient ``(n, d)``; at ``x = 0`` the radial term's (sub)gradient is taken as 0."""
        d = x.shape[-1]
        r = (x * x).mean(-1, keepdim=True).sqrt()
        radial = (a * b / d) * torch.exp(-b * r) / r.clamp_min(torch.finfo(x.dtype).tiny)
        periodic = (c / d) * torch.exp(torch.cos(c * x).mean(-1, keepdim=True))
        return radial * x + periodic * torch.sin(c * x)


class RastriginEnergy(AnalyticEnergy):
    """Rastrigin's function: ``A d + Σᵢ xᵢ² − A cos(2π xᵢ)``; a regular grid of local minima."""

    op = "rastrigin"
    params = (scalar("amplitude", 10.0, positive=True),)
    sample_scale = 1.5

    def __init__(self, dim: int = 2, amplitude: float = 10.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.set_parameters(amplitude=amplitude)

    @staticmethod
    def reference_energy(x: Tensor, amplitude: float) -> Tensor:
        """``A d + sum_i x_i^2 - A cos(2 pi x_i)``: ``(n,)``."""
        d = x.shape[-1]
        return amplitude * d + (x * x - amplitude * torch.cos(2.0 * math.pi * x)).sum(-1)

    @staticmethod
    def reference_gradient(x: Tensor, amplitude: float) -> Tensor:
        """``2 x + 2 pi A sin(2 pi x)``: ``(n, d)``."""
        return 2.0 * x + (2.0 * math.pi * amplitude) * torch.sin(2.0 * math.pi * x)
