"""ebmcore: the plugin core of ebm, a PyTorch framework for energy-based models.

Energies ``E(x)`` with gradient ``∇ₓE`` and score ``−∇ₓE``; samplers, integrators,
losses and kernel backends registered by plugins through the hooks in
:mod:`ebmcore.hookspecs` and looked up with :mod:`ebmcore.registry`.

The names exported here are imported on first use (PEP 562), so that the modules that need no torch
(configuration, plugin loading, the ``ebm`` parser) can be imported without it: ``ebm --help`` and
``ebm --version`` answer without importing torch. ``ebmcore.EnergyModel``, ``from ebmcore import hookimpl``
and ``ebmcore.energies`` work as if everything were imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ebmcore.version import __version__

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and the API pages
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

_LAZY = {  # exported name -> the module that defines it (a module itself where the two are the same)
    "diagnostics": "ebmcore.diagnostics",
    "registry": "ebmcore.registry",
    **dict.fromkeys(["Config", "get_config", "reload_config"], "ebmcore.config"),
    **dict.fromkeys(
        [
            "AckleyEnergy",
            "AnalyticEnergy",
            "DoubleWellEnergy",
            "EnergyFunctions",
            "EnergyModel",
            "GaussianEnergy",
            "GaussianMixtureEnergy",
            "HarmonicEnergy",
            "MLPEnergy",
            "RastriginEnergy",
            "RosenbrockEnergy",
            "SequentialEnergy",
        ],
        "ebmcore.energies",
    ),
    **dict.fromkeys(
        [
            "BackendUnavailableError",
            "ConfigError",
            "DivergenceError",
            "DuplicateComponentError",
            "EBMError",
            "InputError",
            "NonFiniteError",
            "PluginError",
            "RunFileError",
            "UnknownComponentError",
        ],
        "ebmcore.errors",
    ),
    "hookimpl": "ebmcore.hookspecs",
    "Integrator": "ebmcore.integrator",
    **dict.fromkeys(["Kernel", "KernelBackend", "dispatch", "explain", "resolve_kernel", "use_backend"], "ebmcore.kernels"),
    "Loss": "ebmcore.loss",
    "register_plugin": "ebmcore.plugins",
    "Sampler": "ebmcore.sampler",
}


def __getattr__(name: str) -> Any:
    """Import an exported name (or a submodule: ``ebmcore.energies``) on first use and keep it here."""
    where = _LAZY.get(name)
    if where is None and name.startswith("__"):  # probes such as __wrapped__ or __test__
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where is None:
        try:
            value: Any = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        module = importlib.import_module(where)
        value = module if where == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def energy(name: str, **params: object) -> EnergyModel:
    """Build the registered energy ``name``: ``ebmcore.energy("gaussian", dim=2)``."""
    from ebmcore import registry

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
