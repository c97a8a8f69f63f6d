"""Euler–Maruyama for overdamped Langevin dynamics ``dx = −∇E(x) dt + √(2T) dW``."""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from ebmcore import Integrator, resolve_kernel

__all__ = ["EulerMaruyama", "SDEUpdate"]

SDEUpdate = Callable[..., Tensor]
"""``update(x, grad, noise, step_size, noise_scale) -> x'`` with ``grad = ∇E(x)``, ``noise_scale = √(2hT)``."""


class EulerMaruyama(Integrator):
    """``x' = x − h ∇E(x) + √(2hT) ξ`` (strong order ½, weak order 1).

    The contract of ``sde`` integrators: ``bind(like)`` returns an :data:`SDEUpdate` for states
    like ``like``, with any kernel resolved once. Here the update is the core's ``langevin_step``
    kernel op, so a kernel backend (e.g. ``ebm-cuda``) can replace it.
    """

    name = "euler_maruyama"
    kind = "sde"
    order = 0.5

    def bind(self, like: Tensor) -> SDEUpdate:
        """The update ``(x, grad, noise, h, √(2hT)) -> x'`` for states like ``like``: its kernel, resolved once."""
        return resolve_kernel("langevin_step", like.device, like.dtype).fn
