"""ebm-samplers: Langevin (ULA), MALA, HMC, NUTS, annealed Langevin and parallel tempering over
batches of chains; their integrators; step-size and mass-matrix adaptation.

Each algorithm is a module with a functional ``init``/``step`` pair (``langevin``, ``mala``, ``hmc``)
and an object API (``LangevinSampler``, ``MALASampler``, ``HMCSampler``) with ``.sample(...)``.
"""

from ebm_samplers import adaptation, hmc, langevin, mala, nuts
from ebm_samplers.adaptation import DualAveraging, WarmupResult, WelfordVariance, stan_windows, warmup
from ebm_samplers.annealed import AnnealedLangevinSampler, geometric_sigmas
from ebm_samplers.tempering import ParallelTemperingSampler, geometric_temperatures
from ebm_samplers.base import Diagnostics, MCMCSampler, NonFiniteChainsWarning, SampleResult
from ebm_samplers.hmc import HMCSampler
from ebm_samplers.integrators import DOPRI5, EulerMaruyama, Heun, Leapfrog, McLachlan, SplittingIntegrator, Yoshida
from ebm_samplers.langevin import LangevinSampler
from ebm_samplers.mala import MALASampler
from ebm_samplers.nuts import NUTSSampler
from ebm_samplers.tunables import InverseMass, as_inverse_mass

__version__ = "0.1.0"

__all__ = [
    "langevin",
    "mala",
    "hmc",
    "nuts",
    "LangevinSampler",
    "MALASampler",
    "HMCSampler",
    "NUTSSampler",
    "AnnealedLangevinSampler",
    "ParallelTemperingSampler",
    "geometric_sigmas",
    "geometric_temperatures",
    "adaptation",
    "warmup",
    "WarmupResult",
    "DualAveraging",
    "WelfordVariance",
    "stan_windows",
    "MCMCSampler",
    "SampleResult",
    "Diagnostics",
    "NonFiniteChainsWarning",
    "EulerMaruyama",
    "SplittingIntegrator",
    "Leapfrog",
    "McLachlan",
    "Yoshida",
    "Heun",
    "DOPRI5",
    "InverseMass",
    "as_inverse_mass",
]
