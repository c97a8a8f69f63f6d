"""Registers the losses of ebm-losses, its ``conv`` image energy and its ``noise_conditional_mlp`` energy with ebmcore (entry point ``losses``)."""

from __future__ import annotations

from ebmcore import hookimpl
from ebmcore.registry import Registrar

from ebm_losses.conv import ConvEnergy
from ebm_losses.contrastive_divergence import ContrastiveDivergence, PersistentContrastiveDivergence
from ebm_losses.energy_matching import EnergyMatching
from ebm_losses.equilibrium_matching import EquilibriumMatching
from ebm_losses.nce import NoiseContrastiveEstimation
from ebm_losses.gaussian_residual import GaussianResidualEnergy
from ebm_losses.image_mlp import ImageMLPEnergy
from ebm_losses.jem import JointEnergy, JointEnergyLoss
from ebm_losses.noise_conditional import NoiseConditionalEnergy
from ebm_losses.ops import LOSS_OPS
from ebm_losses.whitened_cd import WhitenedContrastiveDivergence
from ebm_losses.score_matching import DenoisingScoreMatching, ScoreMatching, SlicedScoreMatching


@hookimpl
def ebm_register_energies(registry: Registrar) -> None:
    registry.register_energy("conv", ConvEnergy)
    registry.register_energy("noise_conditional_mlp", NoiseConditionalEnergy)
    registry.register_energy("image_mlp", ImageMLPEnergy)
    registry.register_energy("gaussian_residual", GaussianResidualEnergy)
    registry.register_energy("joint_energy", JointEnergy)


@hookimpl
def ebm_register_losses(registry: Registrar) -> None:
    registry.register_loss("contrastive_divergence", ContrastiveDivergence)
    registry.register_loss("persistent_contrastive_divergence", PersistentContrastiveDivergence)
    registry.register_loss("score_matching", ScoreMatching)
    registry.register_loss("sliced_score_matching", SlicedScoreMatching)
    registry.register_loss("denoising_score_matching", DenoisingScoreMatching)
    registry.register_loss("nce", NoiseContrastiveEstimation)
    registry.register_loss("energy_matching", EnergyMatching)
    registry.register_loss("equilibrium_matching", EquilibriumMatching)
    registry.register_loss("whitened_contrastive_divergence", WhitenedContrastiveDivergence)
    registry.register_loss("jem", JointEnergyLoss)


@hookimpl
def ebm_register_ops(registry: Registrar) -> None:
    for op in LOSS_OPS.values():
        registry.register_op(op)


@hookimpl
def ebm_add_commands(subparsers) -> None:
    from ebm_losses import train_job

    train_job.add_command(subparsers)
