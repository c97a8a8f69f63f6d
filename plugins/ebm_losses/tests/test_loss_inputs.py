"""What every loss refuses clearly (a model that is not an EnergyModel, a generator that is not one, non-finite
parameters) and the right value where autograd alone would fail (an energy linear in x has no Hessian term)."""

import math

import pytest
import torch

import ebmcore
from ebm_losses import (
    ContrastiveDivergence,
    DenoisingScoreMatching,
    EnergyMatching,
    EquilibriumMatching,
    NoiseContrastiveEstimation,
    PersistentContrastiveDivergence,
    ScoreMatching,
    SlicedScoreMatching,
)
from ebm_losses.score_matching import projections
from ebmcore.errors import InputError

LOSSES = {
    "cd": lambda: ContrastiveDivergence("langevin", 2, sampler_options={"step_size": 0.01}),
    "pcd": lambda: PersistentContrastiveDivergence("langevin", 2, sampler_options={"step_size": 0.01}, buffer_size=32),
    "exact": lambda: ScoreMatching("exact"),
    "hutchinson": lambda: ScoreMatching("hutchinson"),
    "sliced": lambda: SlicedScoreMatching(),
    "sliced-vr": lambda: SlicedScoreMatching(variance_reduction=True),
    "dsm": lambda: DenoisingScoreMatching(0.1),
    "dsm-multi": lambda: DenoisingScoreMatching(sigmas=[1.0, 0.1]),
    "nce": lambda: NoiseContrastiveEstimation(),
    "energy-matching-flow": lambda: EnergyMatching(5, coupling="independent"),
    "energy-matching": lambda: EnergyMatching(0, coupling="independent", n_steps=2),
    "equilibrium": lambda: EquilibriumMatching(),
}


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("model", [lambda x: x.sum(-1), torch.nn.Linear(2, 1)], ids=["function", "module"])
def test_every_loss_refuses_a_model_that_is_not_an_energy_model(name, model):
    with pytest.raises(
        InputError,
        match=r"needs an ebmcore\.EnergyModel as its first argument, got (function|Linear); "
        r"subclass EnergyModel",
    ):
        LOSSES[name]()(model, torch.randn(8, 2))


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_refuses_a_generator_that_is_not_one_in_the_samplers_words(name):
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    with pytest.raises(InputError, match=r"generator must be a torch\.Generator, got int"):
        LOSSES[name]()(energy, torch.randn(8, 2), generator=3)


@pytest.mark.parametrize("name", ["energy-matching-flow", "energy-matching", "equilibrium"])
@pytest.mark.parametrize("generator", [3, "cpu", "cuda"])
def test_energy_and_equilibrium_matching_check_the_generator_in_training_and_generation(name, generator):
    """Issue 40: these two drew their noise with the generator unchecked (torch.randn's TypeError)."""
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    message = rf"generator must be a torch\.Generator, got {type(generator).__name__}; use torch\.Generator\(\)"
    loss = LOSSES[name]()
    with pytest.raises(InputError, match=message):
        loss(energy, torch.randn(8, 2), generator=generator)
    with pytest.raises(InputError, match=message):
        loss.generate(energy, 3, torch.randn(8, 2), generator=generator)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: NoiseContrastiveEstimation(log_normalizer=math.nan), r"log_normalizer must be a finite number, got nan"),
        (lambda: NoiseContrastiveEstimation(log_normalizer=math.inf), r"log_normalizer must be a finite number, got inf"),
        (lambda: NoiseContrastiveEstimation(log_normalizer="1"), r"log_normalizer must be a finite number, got '1'"),
        (lambda: ContrastiveDivergence(regularization=math.inf), r"regularization must be a finite number >= 0, got inf"),
        (lambda: ContrastiveDivergence(regularization=math.nan), r"regularization must be a finite number >= 0, got nan"),
        (lambda: PersistentContrastiveDivergence(regularization=math.inf), r"regularization must be a finite number >= 0"),
        (
            lambda: EnergyMatching(coupling="independent", flow_weight=math.inf),
            r"flow_weight must be a finite number >= 0, got inf",
        ),
        (lambda: EnergyMatching(coupling="independent", flow_weight=-1.0), r"flow_weight must be a finite number >= 0, got -1"),
        (
            lambda: EnergyMatching(coupling="independent", regularization=math.inf),
            r"regularization must be a finite number >= 0, got inf",
        ),
        (lambda: EnergyMatching(coupling="independent", tau_star=math.nan), r"tau_star must be a finite number in \[0, 1\]"),
        (lambda: EnergyMatching(coupling="independent", tau_star=2.0), r"tau_star must be a finite number in \[0, 1\], got 2"),
    ],
)
def test_non_finite_loss_parameters_are_refused(build, message):
    with pytest.raises(InputError, match=message):
        build()


class Linear(ebmcore.EnergyModel):
    """``E(x) = w·x + b``: its gradient ``w`` does not depend on ``x``, its Hessian is zero."""

    event_shape = (3,)

    def __init__(self, learnable: bool) -> None:
        super().__init__()
        w, b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
        if learnable:
            self.w, self.b = torch.nn.Parameter(w), torch.nn.Parameter(b)
        else:
            self.register_buffer("w", w)
            self.register_buffer("b", b)

    def compute_energy(self, x):
        return x @ self.w + self.b


@pytest.mark.parametrize("learnable", [True, False], ids=["parameters", "buffers"])
@pytest.mark.parametrize("name", ["exact", "hutchinson", "sliced", "sliced-vr"])
def test_score_matching_of_a_linear_energy_is_its_closed_form(name, learnable):
    # J = mean(½(vᵀw)²) sliced, ½|w|² otherwise: the Hessian term is zero
    energy = Linear(learnable)
    x = torch.randn(10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = LOSSES[name]()(energy, x, generator=torch.Generator().manual_seed(2))
    w = energy.w.detach()
    if name == "sliced":
        v = projections("rademacher", (10, 3), like=x, generator=torch.Generator().manual_seed(2))
        expected = (0.5 * (v @ w) ** 2).mean()
    else:
        expected = 0.5 * w.square().sum()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-12, atol=1e-12)
    if learnable:  # and its gradient in the weights: w for ½|w|²
        loss.backward()
        assert energy.w.grad is not None and bool(torch.isfinite(energy.w.grad).all())
        if name != "sliced":
            torch.testing.assert_close(energy.w.grad, w)
