"""Classic test landscapes: double well, Rosenbrock, harmonic, Ackley, Rastrigin.

They hold no tensor parameters (except the harmonic center), so they accept
inputs of any float dtype on any device.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.errors import InputError
from ebmcore.validation import check_positive

__all__ = ["DoubleWellEnergy", "RosenbrockEnergy", "HarmonicEnergy", "AckleyEnergy", "RastriginEnergy"]


class DoubleWellEnergy(AnalyticEnergy):
    """``E(x) = barrier · Σᵢ (xᵢ² − 1)²``: modes at ``xᵢ = ±1`` in every coordinate."""

    op = "double_well"

    def __init__(self, dim: int = 2, barrier: float = 1.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.barrier = check_positive(barrier, "DoubleWellEnergy barrier")

    def kernel_args(self) -> tuple[Any, ...]:
        """``(barrier,)``, the ``double_well`` kernels' argument after ``x``."""
        return (self.barrier,)


class RosenbrockEnergy(AnalyticEnergy):
    """``E(x) = Σ_{i<d} b (x_{i+1} − xᵢ²)² + (a − xᵢ)²``: a curved valley; with the default ``a = 1`` the
    global minimum ``E = 0`` is at ``(1, …, 1)``."""

    op = "rosenbrock"

    def __init__(self, dim: int = 2, a: float = 1.0, b: float = 100.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        if dim < 2:
            raise InputError(f"RosenbrockEnergy needs dim >= 2, got {dim}.")
        self.a = float(a)
        self.b = check_positive(b, "RosenbrockEnergy b")

    def kernel_args(self) -> tuple[Any, ...]:
        """``(a, b)``, the ``rosenbrock`` kernels' arguments after ``x``."""
        return (self.a, self.b)


class HarmonicEnergy(AnalyticEnergy):
    """``E(x) = ½ k |x − c|²``: an isotropic Gaussian with variance ``1/k`` around ``center``."""

    op = "harmonic"

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
        self.stiffness = check_positive(stiffness, "HarmonicEnergy stiffness")
        c = torch.zeros(dim, dtype=dtype, device=device) if center is None else torch.as_tensor(center, device=device)
        if not c.is_floating_point():
            c = c.to(dtype or torch.get_default_dtype())
        c = c.to(dtype or c.dtype)
        if c.shape != (dim,) or not bool(torch.isfinite(c).all()):
            raise InputError(f"HarmonicEnergy: center must be {dim} finite numbers, shape ({dim},); got shape {tuple(c.shape)}.")
        self.register_buffer("center", c)

    def kernel_args(self) -> tuple[Any, ...]:
        """``(center: (d,), stiffness)``, the ``harmonic`` kernels' arguments after ``x``."""
        return (self.center, self.stiffness)


class AckleyEnergy(AnalyticEnergy):
    """Ackley's function: ``−a exp(−b √(mean x²)) − exp(mean cos(c x)) + a + e``; many local minima, global at 0."""

    op = "ackley"

    def __init__(self, dim: int = 2, a: float = 20.0, b: float = 0.2, c: float = 2 * math.pi, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.a, self.b, self.c = float(a), check_positive(b, "AckleyEnergy b"), float(c)

    def kernel_args(self) -> tuple[Any, ...]:
        """``(a, b, c)``, the ``ackley`` kernels' arguments after ``x``."""
        return (self.a, self.b, self.c)


class RastriginEnergy(AnalyticEnergy):
    """Rastrigin's function: ``A d + Σᵢ xᵢ² − A cos(2π xᵢ)``; a regular grid of local minima."""

    op = "rastrigin"

    def __init__(self, dim: int = 2, amplitude: float = 10.0, *, backend: str | None = None) -> None:
        super().__init__(dim, backend)
        self.amplitude = check_positive(amplitude, "RastriginEnergy amplitude")

    def kernel_args(self) -> tuple[Any, ...]:
        """``(amplitude,)``, the ``rastrigin`` kernels' argument after ``x``."""
        return (self.amplitude,)
