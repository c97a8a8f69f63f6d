"""ebm-samplers: Langevin (ULA), MALA and HMC over batches of chains, and their integrators.

Each algorithm is a module with a functional ``init``/``step`` pair (``langevin``, ``mala``, ``hmc``)
and an object API (``LangevinSampler``, ``MALASampler``, ``HMCSampler``) with ``.sample(...)``.
"""

from ebm_samplers import hmc, langevin, mala
from ebm_samplers.base import Diagnostics, MCMCSampler, NonFiniteChainsWarning, SampleResult
from ebm_samplers.hmc import HMCSampler
from ebm_samplers.integrators import DOPRI5, EulerMaruyama, Heun, Leapfrog, McLachlan, SplittingIntegrator, Yoshida
from ebm_samplers.langevin import LangevinSampler
from ebm_samplers.mala import MALASampler
from ebm_samplers.tunables import InverseMass, as_inverse_mass

__version__ = "0.1.0"

__all__ = [
    "langevin",
    "mala",
    "hmc",
    "LangevinSampler",
    "MALASampler",
    "HMCSampler",
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
