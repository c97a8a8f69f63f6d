"""Energy models: the base class, the builtin energies, and the parameter tables of analytic energies."""

from typing import Any

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.base import EnergyFunctions, EnergyModel
from ebmcore.energies.catalog import builtin_analytic_energies
from ebmcore.energies.gaussian import GaussianEnergy, GaussianMixtureEnergy
from ebmcore.energies.landscapes import AckleyEnergy, DoubleWellEnergy, HarmonicEnergy, RastriginEnergy, RosenbrockEnergy
from ebmcore.energies.mlp import MLPEnergy
from ebmcore.energies.program import Program
from ebmcore.energies.sequential import SequentialEnergy
from ebmcore.energies.params import Param, matrix, scalar, tensor, vector

__all__ = [
    "EnergyModel",
    "EnergyFunctions",
    "AnalyticEnergy",
    "Param",
    "scalar",
    "vector",
    "matrix",
    "tensor",
    "builtin_analytic_energies",
    "GaussianEnergy",
    "GaussianMixtureEnergy",
    "DoubleWellEnergy",
    "RosenbrockEnergy",
    "HarmonicEnergy",
    "AckleyEnergy",
    "RastriginEnergy",
    "MLPEnergy",
    "SequentialEnergy",
    "Program",
]


def __getattr__(name: str) -> Any:
    """A builtin analytic energy not imported above, by class name (``ebmcore.energies.FooEnergy``)."""
    for cls in builtin_analytic_energies().values():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
