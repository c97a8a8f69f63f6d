"""ebm-losses: training losses for energy models, a training loop, a convolutional image energy (``conv``),
2-d toy datasets and image data."""

from ebm_losses import datasets
from ebm_losses.conv import ConvEnergy
from ebm_losses.contrastive_divergence import ClippedGradientEnergy, ContrastiveDivergence, PersistentContrastiveDivergence
from ebm_losses.energy_matching import BoltzmannEnergy, EnergyMatching
from ebm_losses.equilibrium_matching import EquilibriumMatching
from ebm_losses.nce import GaussianNoise, NoiseContrastiveEstimation
from ebm_losses.noise_conditional import NoiseConditionalEnergy, denoise
from ebm_losses.score_matching import DenoisingScoreMatching, ScoreMatching, SlicedScoreMatching
from ebm_losses.training import LiveLog, Trainer, TrainHistory
from ebm_losses.watchdog import Watchdog

__version__ = "0.1.0"

__all__ = [
    "datasets",
    "ContrastiveDivergence",
    "PersistentContrastiveDivergence",
    "ClippedGradientEnergy",
    "ConvEnergy",
    "ScoreMatching",
    "SlicedScoreMatching",
    "DenoisingScoreMatching",
    "NoiseContrastiveEstimation",
    "GaussianNoise",
    "NoiseConditionalEnergy",
    "EnergyMatching",
    "BoltzmannEnergy",
    "EquilibriumMatching",
    "denoise",
    "Trainer",
    "TrainHistory",
    "LiveLog",
    "Watchdog",
]
