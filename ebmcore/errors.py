"""Every error ebmcore raises: one class per kind of problem, each message naming the fix."""

from __future__ import annotations

__all__ = [
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
    "MissingDependencyError",
]


class EBMError(Exception):
    """Base class of all ebmcore errors."""


class InputError(EBMError, ValueError):
    """A tensor or parameter given to ebmcore has the wrong shape, dtype, device or value."""


class NonFiniteError(EBMError, FloatingPointError):
    """A state, energy or loss that must be finite is not."""


class DivergenceError(NonFiniteError):
    """Training diverged (a non-finite loss, energies or gradient, a blow-up, collapsed negatives) past recovery."""


class UnknownComponentError(EBMError, LookupError):
    """No plugin registered a component of this kind under this name."""


class DuplicateComponentError(EBMError, LookupError):
    """Two plugins registered the same name and neither declared an override."""


class PluginError(EBMError):
    """A plugin failed to import or to register its components."""


class BackendUnavailableError(EBMError, RuntimeError):
    """No kernel that the active backend selection allows can run these inputs."""


class ConfigError(EBMError, ValueError):
    """A configuration file or environment variable holds an unknown key or a bad value."""


class RunFileError(EBMError, OSError):
    """A run file could not be written (read-only or full disk) or read back (missing, truncated, not ebm's)."""


class MissingDependencyError(EBMError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the extra to install."""
