"""Helpers for testing ebmcore plugins: isolated plugin sessions, throw-away installed
distributions, and contract checks for energies, samplers, losses and kernel backends.

Fixtures for pytest: add ``pytest_plugins = ["ebmcore.testing.fixtures"]`` to a ``conftest.py``.
"""

from ebmcore.testing.contracts import check_energy, check_kernel, check_loss, check_program, check_sampler
from ebmcore.testing.plugins import installed_distribution, isolated_plugins

__all__ = [
    "isolated_plugins",
    "installed_distribution",
    "check_energy",
    "check_program",
    "check_sampler",
    "check_loss",
    "check_kernel",
]
