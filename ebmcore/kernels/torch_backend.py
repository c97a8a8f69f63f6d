"""The ``torch`` reference backend: every op in plain PyTorch, on every device and float dtype.

These are the definitions other backends are checked against
(``ebmcore.testing.check_kernel``). The energy ops are the reference functions
that each analytic energy declares next to its class (``reference_energy`` and
``reference_gradient``, see :class:`~ebmcore.energies.AnalyticEnergy`): those
of the builtin energies, and, for the backend the builtin plugin registers,
those of every analytic energy a plugin registers. All take ``x: (n, d)`` and
return energies ``(n,)`` or gradients ``(n, d)`` in ``x``'s dtype; all are
differentiable (``create_graph`` works through them).
``torch_backend.<op>_energy`` and ``torch_backend.<op>_gradient`` name the
builtin energies' references.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.catalog import builtin_analytic_energies, declares_op
from ebmcore.kernels.base import Kernel, KernelBackend

__all__ = ["TorchBackend", "add_scaled", "add_scaled_", "langevin_step", "reference_kernels", "registered_analytic_energies"]

_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta")


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


def _kernel(op: str, fn: Callable[..., Any]) -> Kernel:
    return Kernel(op=op, fn=fn, device_types=_DEVICE_TYPES, priority=0)


def reference_kernels(energy: type[AnalyticEnergy]) -> list[Kernel]:
    """The kernels ``<op>_energy`` and ``<op>_gradient`` from ``energy``'s reference functions (none if it
    declares none)."""
    if energy.reference_energy is None or energy.reference_gradient is None:
        return []
    return [_kernel(f"{energy.op}_energy", energy.reference_energy), _kernel(f"{energy.op}_gradient", energy.reference_gradient)]


def registered_analytic_energies() -> list[type[AnalyticEnergy]]:
    """The analytic energy classes registered (by any plugin) in the current plugin session."""
    from ebmcore import registry

    return [e.component for e in registry.entries("energy") if declares_op(e.component)]


class TorchBackend(KernelBackend):
    """Pure PyTorch: runs on every device and float dtype; priority 0, so any faster kernel wins.

    Its kernels are ``langevin_step`` and the reference kernels of every builtin analytic energy.
    With ``registered`` (a callable returning energy classes; the builtin plugin passes
    :func:`registered_analytic_energies`) it also serves, looked up when asked, the reference kernels
    of those energies, so a plugin's analytic energy runs on ``torch`` without a backend of its own.
    A builtin op is never replaced.
    """

    def __init__(self, registered: Callable[[], Iterable[type[AnalyticEnergy]]] | None = None) -> None:
        kernels = [_kernel("langevin_step", langevin_step)]
        for energy in builtin_analytic_energies().values():
            kernels += reference_kernels(energy)
        super().__init__("torch", kernels, description="pure PyTorch reference implementations")
        self._registered = registered

    @property
    def kernels(self) -> dict[str, Kernel]:
        """Op name -> kernel: the builtin ones, then those of the registered analytic energies."""
        kernels = super().kernels
        if self._registered is not None:
            for energy in self._registered():
                for kernel in reference_kernels(energy):
                    kernels.setdefault(kernel.op, kernel)
        return kernels


def __getattr__(name: str) -> Any:
    """``gaussian_energy``, ``double_well_gradient``, ...: a builtin analytic energy's reference function."""
    for suffix in ("_energy", "_gradient"):
        energy = builtin_analytic_energies().get(name.removesuffix(suffix)) if name.endswith(suffix) else None
        fn = getattr(energy, f"reference{suffix}", None)
        if fn is not None:
            return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
