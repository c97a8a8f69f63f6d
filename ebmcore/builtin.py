"""The core's builtin plugin: energies, the fused ops and the ``torch`` kernel backend, registered like any plugin.

The analytic energies are those :mod:`ebmcore.energies` declares (each under its ``op``, see
:func:`~ebmcore.energies.builtin_analytic_energies`); the ``torch`` backend serves their reference
kernels, and those of any analytic energy another plugin registers.
"""

from __future__ import annotations

from ebmcore import energies
from ebmcore.hookspecs import hookimpl
from ebmcore.kernels.fused import BUILTIN_FUSED_OPS
from ebmcore.kernels.torch_backend import TorchBackend, registered_analytic_energies
from ebmcore.registry import Registrar


@hookimpl
def ebm_register_energies(registry: Registrar) -> None:
    for op, energy in energies.builtin_analytic_energies().items():
        registry.register_energy(op, energy)
    registry.register_energy("mlp", energies.MLPEnergy)


@hookimpl
def ebm_register_ops(registry: Registrar) -> None:
    for op in BUILTIN_FUSED_OPS:
        registry.register_op(op)


@hookimpl
def ebm_register_kernels(registry: Registrar) -> None:
    registry.register_kernel_backend(TorchBackend(registered=registered_analytic_energies))
