"""ebmcore: the plugin core of ebm, a PyTorch framework for energy-based models.

Energies ``E(x)`` with gradient ``∇ₓE`` and score ``−∇ₓE``; samplers, integrators,
losses and kernel backends registered by plugins through the hooks in
:mod:`ebmcore.hookspecs` and looked up with :mod:`ebmcore.registry`.
"""

from __future__ import annotations

from ebmcore.version import __version__

from ebmcore import diagnostics, registry
from ebmcore.config import Config, get_config, reload_config
from ebmcore.energies import (
    AckleyEnergy,
    AnalyticEnergy,
    DoubleWellEnergy,
    EnergyFunctions,
    EnergyModel,
    GaussianEnergy,
    GaussianMixtureEnergy,
    HarmonicEnergy,
    MLPEnergy,
    RastriginEnergy,
    RosenbrockEnergy,
    SequentialEnergy,
)
from ebmcore.errors import (
    BackendUnavailableError,
    ConfigError,
    DivergenceError,
    DuplicateComponentError,
    EBMError,
    InputError,
    NonFiniteError,
    PluginError,
    RunFileError,
    UnknownComponentError,
)
from ebmcore.hookspecs import hookimpl
from ebmcore.integrator import Integrator
from ebmcore.kernels import Kernel, KernelBackend, dispatch, explain, resolve_kernel, use_backend
from ebmcore.loss import Loss
from ebmcore.plugins import register_plugin
from ebmcore.sampler import Sampler


def energy(name: str, **params: object) -> EnergyModel:
    """Build the registered energy ``name``: ``ebmcore.energy("gaussian", dim=2)``."""
    return registry.get("energy", name)(**params)


__all__ = [
    "__version__",
    "registry",
    "diagnostics",
    "energy",
    "hookimpl",
    "register_plugin",
    "Config",
    "get_config",
    "reload_config",
    "EnergyModel",
    "EnergyFunctions",
    "AnalyticEnergy",
    "GaussianEnergy",
    "GaussianMixtureEnergy",
    "DoubleWellEnergy",
    "RosenbrockEnergy",
    "HarmonicEnergy",
    "AckleyEnergy",
    "RastriginEnergy",
    "MLPEnergy",
    "SequentialEnergy",
    "Sampler",
    "Integrator",
    "Loss",
    "Kernel",
    "KernelBackend",
    "dispatch",
    "explain",
    "resolve_kernel",
    "use_backend",
    "EBMError",
    "InputError",
    "NonFiniteError",
    "DivergenceError",
    "UnknownComponentError",
    "DuplicateComponentError",
    "PluginError",
    "BackendUnavailableError",
    "ConfigError",
    "RunFileError",
]
