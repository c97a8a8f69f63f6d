"""Euler–Maruyama for overdamped Langevin dynamics ``dx = −∇E(x) dt + √(2T) dW``."""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from ebmcore import Integrator

__all__ = ["EulerMaruyama"]


class EulerMaruyama(Integrator):
    """``x' = x − h ∇E(x) + √(2hT) ξ`` (strong order ½, weak order 1).

    The interface of ``sde`` integrators: ``step(x, grad, noise, step_size, noise_scale, gradient)``
    returns ``(x', ∇E(x'))``; ``noise_scale`` is ``√(2hT)`` (a float or ``(n, 1, ...)``).
    """

    name = "euler_maruyama"
    kind = "sde"
    order = 0.5
    gradient_evaluations_per_step = 1

    def step(self, x: Tensor, grad: Tensor, noise: Tensor, step_size, noise_scale, gradient: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        if isinstance(step_size, float) and isinstance(noise_scale, float):
            new = x.add(grad, alpha=-step_size).add_(noise, alpha=noise_scale)
        else:
            new = x - step_size * grad + noise_scale * noise
        return new, gradient(new)
