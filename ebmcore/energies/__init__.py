"""Energy models: the base class and the builtin energies."""

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.base import EnergyFunctions, EnergyModel
from ebmcore.energies.gaussian import GaussianEnergy, GaussianMixtureEnergy
from ebmcore.energies.landscapes import AckleyEnergy, DoubleWellEnergy, HarmonicEnergy, RastriginEnergy, RosenbrockEnergy
from ebmcore.energies.mlp import MLPEnergy

__all__ = [
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
]
