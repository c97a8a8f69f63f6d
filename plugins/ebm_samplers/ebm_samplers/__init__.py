"""ebm-samplers: Langevin (ULA), MALA, HMC, NUTS, ChEES-HMC (:mod:`ebm_samplers.chees`, tuned by
:func:`~ebm_samplers.chees_adaptation.chees_warmup`), MEADS (generalized HMC, :mod:`ebm_samplers.meads`, tuned by
:func:`~ebm_samplers.meads_adaptation.meads_warmup`), annealed Langevin and parallel tempering over batches of chains;
their integrators; annealed importance sampling for ``log Z`` (:mod:`ebm_samplers.ais`) and adaptive tempered SMC
(:mod:`ebm_samplers.smc`); step-size and mass-matrix adaptation; the ``ebm sample`` and
``ebm profile`` commands, which run any sampler.

Each algorithm is a module (``langevin``, ``mala``, ``hmc``, ``nuts``, ``chees``, ``meads``, ``annealed``, ``tempering``)
exporting ``State``, ``Info``, ``Params``, ``init`` and ``build_kernel`` (see
:mod:`ebm_samplers.algorithm`), and an object API over it (``LangevinSampler``, ``MALASampler``, ...)
whose ``.sample(...)`` is the loop every ``ebmcore.Sampler`` shares.
"""

from ebm_samplers import (
    adaptation,
    ais,
    annealed,
    chees,
    chees_adaptation,
    hmc,
    langevin,
    mala,
    meads,
    meads_adaptation,
    nuts,
    resampling,
    smc,
    tempered_path,
    tempering,
)
from ebm_samplers.ais import AISResult, estimate_log_z
from ebm_samplers.smc import SMCResult, adaptive_tempered_smc
from ebm_samplers.adaptation import (
    DualAveraging,
    WarmupResult,
    WelfordCovariance,
    WelfordVariance,
    cannot_warm_up,
    stan_windows,
    warmup,
)
from ebm_samplers.algorithm import DIVERGENCE_THRESHOLD, Algorithm
from ebm_samplers.annealed import AnnealedLangevinSampler, geometric_sigmas
from ebm_samplers.chees import ChEESSampler
from ebm_samplers.chees_adaptation import ChEESWarmupResult, chees_warmup
from ebm_samplers.hmc import HMCSampler
from ebm_samplers.integrators import DOPRI5, EulerMaruyama, Heun, Leapfrog, McLachlan, SplittingIntegrator, Yoshida
from ebm_samplers.langevin import LangevinSampler
from ebm_samplers.mala import MALASampler
from ebm_samplers.meads import MEADSSampler
from ebm_samplers.meads_adaptation import MEADSWarmupResult, meads_warmup
from ebm_samplers.nuts import NUTSSampler
from ebm_samplers.params import InverseMass, as_inverse_mass
from ebmcore.recording import Diagnostics, NonFiniteChainsWarning, SampleResult
from ebm_samplers.sampler import AlgorithmSampler
from ebm_samplers.tempering import ParallelTemperingSampler, geometric_temperatures

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "AlgorithmSampler",
    "langevin",
    "mala",
    "hmc",
    "nuts",
    "chees",
    "chees_adaptation",
    "meads",
    "meads_adaptation",
    "annealed",
    "tempering",
    "LangevinSampler",
    "MALASampler",
    "HMCSampler",
    "NUTSSampler",
    "ChEESSampler",
    "chees_warmup",
    "ChEESWarmupResult",
    "MEADSSampler",
    "meads_warmup",
    "MEADSWarmupResult",
    "AnnealedLangevinSampler",
    "ParallelTemperingSampler",
    "geometric_sigmas",
    "geometric_temperatures",
    "ais",
    "estimate_log_z",
    "AISResult",
    "smc",
    "adaptive_tempered_smc",
    "SMCResult",
    "resampling",
    "tempered_path",
    "adaptation",
    "warmup",
    "cannot_warm_up",
    "WarmupResult",
    "DualAveraging",
    "WelfordVariance",
    "WelfordCovariance",
    "stan_windows",
    "SampleResult",
    "Diagnostics",
    "NonFiniteChainsWarning",
    "DIVERGENCE_THRESHOLD",
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
