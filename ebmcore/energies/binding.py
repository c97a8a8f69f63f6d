"""An energy's hot-loop callables for a run, bound once: under ``torch.autocast``, or traceable by ``torch.compile``."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ebmcore.energies.base import EnergyFunctions, EnergyModel, uses_autograd

__all__ = ["bind_energy"]


def bind_energy(
    energy: EnergyModel, like: Tensor, *, autocast: torch.dtype | None = None, traceable: bool = False
) -> EnergyFunctions:
    """The energy's hot-loop callables for states like ``like`` (kernels resolved now): under ``torch.autocast``
    (results in the state's dtype) with ``autocast``; with ``traceable``, an autograd gradient becomes
    ``torch.func.grad_and_value``, which ``torch.compile`` traces (``torch.autograd.grad`` is a graph break)."""
    fns = energy.bind(like)
    if traceable and uses_autograd(energy):

        def total(x: Tensor) -> tuple[Tensor, Tensor]:
            e = energy.compute_energy(x)
            return e.sum(), e

        grad_and_value = torch.func.grad_and_value(total, has_aux=True)

        def traced(x: Tensor) -> tuple[Tensor, Tensor]:
            grad, (_, e) = grad_and_value(x)
            return e.detach(), grad.detach()

        fns = EnergyFunctions(fns.energy, lambda x: traced(x)[1], traced, "torch.func.grad_and_value (compile=True)")
    if autocast is None:
        return fns
    device_type, inner = like.device.type, fns

    def cast(f: Callable[[Tensor], Any]) -> Callable[[Tensor], Any]:
        def run(x: Tensor) -> Any:
            with torch.autocast(device_type, dtype=autocast):
                out = f(x)
            return tuple(t.to(x.dtype) for t in out) if isinstance(out, tuple) else out.to(x.dtype)

        return run

    return EnergyFunctions(
        cast(inner.energy),
        cast(inner.gradient),
        cast(inner.energy_and_gradient),
        f"{'autograd' if uses_autograd(energy) else inner.path or 'gradient'} under autocast({autocast})",
    )
