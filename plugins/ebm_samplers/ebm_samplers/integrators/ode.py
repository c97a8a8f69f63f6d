"""ODE integrators for ``dx/dt = f(t, x)`` over a batch (for probability-flow generation and tests):
fixed-step Heun and adaptive Dormand–Prince 5(4) with embedded error control."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ebmcore import Integrator
from ebmcore.errors import InputError

__all__ = ["Heun", "DOPRI5", "ODESolution"]

Field = Callable[[float, Tensor], Tensor]


@dataclass(frozen=True)
class ODESolution:
    """``x: (n, *event_shape)`` at ``t1``; ``n_steps`` accepted, ``n_rejected`` rejected steps;
    ``n_evaluations`` of ``f``."""

    x: Tensor
    n_steps: int
    n_rejected: int
    n_evaluations: int


class Heun(Integrator):
    """Heun's method (explicit trapezoidal rule): order 2, two evaluations per step, fixed steps."""

    name = "heun"
    kind = "ode"
    order = 2

    def solve(self, f: Field, x0: Tensor, t0: float, t1: float, *, n_steps: int = 100) -> ODESolution:
        """Integrate ``dx/dt = f(t, x)`` from ``x0: (n, *event_shape)`` at ``t0`` to ``t1`` in ``n_steps`` equal steps."""
        if not isinstance(n_steps, int) or n_steps < 1:
            raise InputError(f"Heun: n_steps must be a positive integer, got {n_steps!r}.")
        h = (t1 - t0) / n_steps
        x = x0
        for i in range(n_steps):
            t = t0 + i * h
            k1 = f(t, x)
            k2 = f(t + h, x + h * k1)
            x = x + (0.5 * h) * (k1 + k2)
        return ODESolution(x, n_steps, 0, 2 * n_steps)


# Dormand & Prince (1980), RK5(4)7FM: nodes, stages, 5th-order weights and the embedded 4th-order error weights.
_C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
_B_ERR = tuple(b - bs for b, bs in zip(_B, (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)))


class DOPRI5(Integrator):
    """Dormand–Prince 5(4): adaptive step with embedded error control and FSAL (six evaluations per step).

    The error norm is the RMS over all chains and elements of ``err / (atol + rtol·max(|x|, |x'|))``;
    a step is accepted when it is ≤ 1. One host sync per step (the accept decision).
    """

    name = "dopri5"
    kind = "ode"
    order = 5
    adaptive = True

    def solve(
        self,
        f: Field,
        x0: Tensor,
        t0: float,
        t1: float,
        *,
        rtol: float = 1e-6,
        atol: float = 1e-8,
        first_step: float | None = None,
        max_steps: int = 100_000,
    ) -> ODESolution:
        """Integrate ``dx/dt = f(t, x)`` from ``x0: (n, *event_shape)`` at ``t0`` to ``t1`` (forwards or
        backwards) with steps chosen for the tolerances; more than ``max_steps`` steps is an error."""
        if not (0 < rtol < float("inf") and 0 < atol < float("inf")):
            raise InputError(f"DOPRI5: rtol and atol must be finite and positive, got rtol={rtol}, atol={atol}.")
        if first_step is not None and not (0 < first_step < float("inf")):
            raise InputError(
                f"DOPRI5: first_step must be a finite positive step length (the direction comes from t0, t1), got {first_step}."
            )
        if not isinstance(max_steps, int) or max_steps < 1:
            raise InputError(f"DOPRI5: max_steps must be a positive integer, got {max_steps!r}.")
        direction = 1.0 if t1 >= t0 else -1.0
        span = abs(t1 - t0)
        t, x = t0, x0
        k1 = f(t, x)
        evaluations = 1
        h = first_step if first_step is not None else self._initial_step(x, k1, rtol, atol, span)
        accepted = rejected = 0
        while abs(t - t0) < span * (1 - 1e-12):
            if accepted + rejected >= max_steps:
                raise InputError(
                    f"DOPRI5: more than {max_steps} steps; loosen rtol/atol, raise max_steps, or check the field for stiffness."
                )
            h = min(h, span - abs(t - t0))
            k = [k1]
            for i in range(1, 7):
                xi = x + (direction * h) * sum(a * kj for a, kj in zip(_A[i], k) if a != 0.0)
                k.append(f(t + direction * _C[i] * h, xi))
            evaluations += 6
            x_new = xi  # stage 7 is evaluated at the 5th-order solution (FSAL)
            err = (direction * h) * sum(e * kj for e, kj in zip(_B_ERR, k) if e != 0.0)
            scale = atol + rtol * torch.maximum(x.abs(), x_new.abs())
            norm = float(torch.sqrt(torch.mean((err / scale) ** 2)))
            if math.isfinite(norm) and norm <= 1.0:
                t += direction * h
                x, k1 = x_new, k[6]
                accepted += 1
            else:
                rejected += 1
                if h < 1e-12 * max(1.0, span):
                    raise RuntimeError(
                        f"DOPRI5: step size underflow at t={t:.6g} (error norm {norm:.3g}); the field is non-finite or stiff."
                    )
            h *= 0.2 if not math.isfinite(norm) else min(5.0, max(0.2, 0.9 * max(norm, 1e-10) ** -0.2))
        return ODESolution(x, accepted, rejected, evaluations)

    @staticmethod
    def _initial_step(x: Tensor, k1: Tensor, rtol: float, atol: float, span: float) -> float:
        scale = atol + rtol * x.abs()
        d0 = float(torch.sqrt(torch.mean((x / scale) ** 2)))
        d1 = float(torch.sqrt(torch.mean((k1 / scale) ** 2)))
        h = 0.01 * d0 / d1 if d0 > 1e-5 and d1 > 1e-5 else 1e-6
        return min(h, span)
