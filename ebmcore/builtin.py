"""The core's builtin plugin: energies and the ``torch`` kernel backend, registered like any plugin."""

from __future__ import annotations

from ebmcore import energies
from ebmcore.hookspecs import hookimpl
from ebmcore.kernels.torch_backend import TorchBackend
from ebmcore.registry import Registrar


@hookimpl
def ebm_register_energies(registry: Registrar) -> None:
    registry.register_energy("gaussian", energies.GaussianEnergy)
    registry.register_energy("gaussian_mixture", energies.GaussianMixtureEnergy)
    registry.register_energy("double_well", energies.DoubleWellEnergy)
    registry.register_energy("rosenbrock", energies.RosenbrockEnergy)
    registry.register_energy("harmonic", energies.HarmonicEnergy)
    registry.register_energy("ackley", energies.AckleyEnergy)
    registry.register_energy("rastrigin", energies.RastriginEnergy)
    registry.register_energy("mlp", energies.MLPEnergy)


@hookimpl
def ebm_register_kernels(registry: Registrar) -> None:
    registry.register_kernel_backend(TorchBackend())
