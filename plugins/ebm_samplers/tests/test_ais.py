"""Annealed importance sampling against exact log partition functions."""

from __future__ import annotations

import math

import pytest
import torch

from ebmcore import EnergyModel, GaussianEnergy, GaussianMixtureEnergy
from ebmcore.errors import InputError
from ebm_samplers.ais import ExactBase, estimate_log_z as ais, sigmoid_betas
from sampler_problems import gaussian_with_log_z


@pytest.mark.parametrize("d, transition", [(2, "mala"), (10, "mala"), (10, "hmc")])
def test_ais_matches_the_exact_log_z_of_gaussians(d, transition):
    energy, exact = gaussian_with_log_z(d, seed=d)
    result = ais(
        energy, n_chains=512, n_temperatures=200, transition=transition, scale=2.0, generator=torch.Generator().manual_seed(1)
    )
    assert 0 < result.standard_error < 0.1
    assert abs(result.log_z - exact) < 4 * result.standard_error + 1e-3, (result.log_z, exact, result.standard_error)
    # the mean log weight is a lower bound in expectation (Jensen)
    assert result.mean_log_weight < exact + 4 * result.mean_log_weight_se
    assert 0.3 < result.acceptance_rate < 0.95
    assert result.log_weights.shape == (512,) and result.samples.shape == (512, d)


@pytest.mark.parametrize("d", [2, 5])
def test_ais_matches_the_normalised_gaussian_mixture(d):
    """``GaussianMixtureEnergy`` is normalised (``exp(−E)`` is the density), so ``log Z = 0``; three separated modes."""
    means = torch.stack([torch.full((d,), -3.0), torch.zeros(d), torch.full((d,), 3.0)]).double()
    energy = GaussianMixtureEnergy(means, stds=torch.tensor([0.5, 0.8, 0.6]).double(), weights=torch.tensor([0.2, 0.5, 0.3]))
    result = ais(energy, n_chains=512, n_temperatures=300, scale=3.0, generator=torch.Generator().manual_seed(2))
    assert result.standard_error < 0.15
    assert abs(result.log_z) < 4 * result.standard_error + 1e-3, (result.log_z, result.standard_error)


def test_one_temperature_is_plain_importance_sampling_from_the_base():
    """With ``β = (0, 1)`` the weights are ``p/p₀`` at base draws: for the base itself every weight is ``log Z₀``."""
    energy = GaussianEnergy(torch.zeros(3, dtype=torch.float64), covariance=4.0 * torch.eye(3, dtype=torch.float64))
    result = ais(energy, n_chains=64, betas=[0.0, 1.0], scale=2.0, generator=torch.Generator().manual_seed(0))
    exact = 1.5 * math.log(2 * math.pi * 4.0)
    torch.testing.assert_close(result.log_weights, torch.full((64,), exact, dtype=torch.float64))
    assert result.standard_error == pytest.approx(0.0, abs=1e-12) and result.effective_sample_size == pytest.approx(64)


def test_sigmoid_schedule_and_bad_arguments():
    betas = sigmoid_betas(10)
    assert betas[0] == 0.0 and betas[-1] == 1.0 and len(betas) == 11 and all(b > a for a, b in zip(betas, betas[1:]))
    energy = GaussianEnergy(dim=2, dtype=torch.float64)
    with pytest.raises(InputError, match="betas must increase"):
        ais(energy, betas=[0.0, 0.7, 0.5, 1.0])
    with pytest.raises(InputError, match="transition must be one of mala, hmc"):
        ais(energy, transition="nuts")
    with pytest.raises(InputError, match="n_chains must be an integer >= 2"):
        ais(energy, n_chains=1)


class _ImageQuadratic(EnergyModel):
    """``E(x) = ½ Σ (x / s)²`` over images ``(1, 4, 4)``: ``log Z = 16·(log s + ½ log 2π)``."""

    event_shape = (1, 4, 4)

    def __init__(self, s: float) -> None:
        super().__init__()
        self.register_buffer("s", torch.tensor(s, dtype=torch.float64))

    def compute_energy(self, x):
        return 0.5 * (x / self.s).square().sum((1, 2, 3))


class _BadOutput(EnergyModel):
    """``E = ½|x|²`` whose hand-written gradient is cast to int64, or whose energy is ``(n, 1)``."""

    event_shape = (2,)

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad

    def compute_energy(self, x):
        e = 0.5 * x.square().sum(-1)
        return e.unsqueeze(-1) if self.bad == "energy" else e

    def compute_gradient(self, x, create_graph=False):
        return x.long() if self.bad == "gradient" else x


@pytest.mark.parametrize("transition", ["mala", "hmc"])
@pytest.mark.parametrize(
    "bad, message",
    [
        ("gradient", r"_BadOutput's gradient has dtype torch\.int64 for x of dtype torch\.float64; compute_gradient\(x\) must"),
        ("energy", r"_BadOutput\.compute_energy\(x\) returned shape \(8, 1\) .*\.squeeze\(-1\)"),
    ],
)
def test_ais_checks_the_energy_and_its_gradient_once_as_samplers_do(bad, message, transition):
    with pytest.raises(InputError, match=message):
        ais(_BadOutput(bad), n_chains=8, n_temperatures=5, transition=transition, dtype=torch.float64)


def test_ais_takes_image_shaped_states():
    result = ais(
        _ImageQuadratic(0.3),
        n_chains=256,
        n_temperatures=100,
        loc=torch.zeros(1, 4, 4),
        scale=1.0,
        generator=torch.Generator().manual_seed(3),
    )
    exact = 16 * (math.log(0.3) + 0.5 * math.log(2 * math.pi))
    assert result.samples.shape == (256, 1, 4, 4)
    assert abs(result.log_z - exact) < 4 * result.standard_error + 1e-3, (result.log_z, exact, result.standard_error)


def test_ais_on_a_box_matches_the_truncatedgaussian_with_log_z():
    """``bounds``: ``exp(−x²/(2s²))`` on ``[−1, 1]^16`` has ``log Z = d·log(s√(2π)·(Φ(1/s) − Φ(−1/s)))``; moves leaving
    the box are rejected, so the final states stay inside."""
    s = 0.6
    energy = _ImageQuadratic(s)
    exact = 16 * math.log(s * math.sqrt(2 * math.pi) * math.erf(1 / (s * math.sqrt(2))))
    result = ais(energy, n_chains=256, n_temperatures=100, bounds=(-1.0, 1.0), generator=torch.Generator().manual_seed(4))
    assert bool((result.samples.abs() <= 1).all())
    assert abs(result.log_z - exact) < 4 * result.standard_error + 1e-3, (result.log_z, exact, result.standard_error)


def _mixture_base(means: torch.Tensor, std: float) -> ExactBase:
    """An equal-weight mixture of ``N(mₖ, std²I)`` as an exact base: its normalised energy (``log Z₀ = 0``) and draws."""
    mixture = GaussianMixtureEnergy(means, stds=torch.full((len(means),), std, dtype=torch.float64))

    def sample(n: int, generator: torch.Generator | None) -> torch.Tensor:
        k = torch.randint(len(means), (n,), generator=generator)
        return means[k] + std * torch.randn(n, means.shape[1], generator=generator, dtype=torch.float64)

    return ExactBase(mixture.compute_energy, sample, 0.0)


def test_ais_from_an_exact_mixture_base_meets_the_log_z_of_a_mixture():
    """Two modes 8 apart: from a mixture base at the modes, AIS finds ``log Z = 0`` of the normalised target mixture,
    and with the target as its own base every weight is exactly ``log Z₀``."""
    means = torch.tensor([[-4.0, 0.0], [4.0, 0.0]], dtype=torch.float64)
    target = GaussianMixtureEnergy(means, stds=torch.tensor([0.5, 0.7], dtype=torch.float64), weights=torch.tensor([0.3, 0.7]))
    result = ais(
        target, n_chains=256, n_temperatures=50, base=_mixture_base(means, 1.0), generator=torch.Generator().manual_seed(0)
    )
    assert result.standard_error < 0.1 and abs(result.log_z) < 4 * result.standard_error + 1e-3, result
    itself = ais(
        target,
        n_chains=16,
        betas=[0.0, 1.0],
        base=ExactBase(target.compute_energy, _mixture_base(means, 0.6).sample, 0.0),
        generator=torch.Generator().manual_seed(1),
    )
    torch.testing.assert_close(itself.log_weights, torch.zeros(16, dtype=torch.float64))
    # in whitened coordinates: the same target seen through x = loc + 2z, the base given in z
    whitened = ais(
        target,
        n_chains=256,
        n_temperatures=50,
        loc=torch.zeros(2, dtype=torch.float64),
        scale_tril=2.0 * torch.eye(2, dtype=torch.float64),
        base=_mixture_base(means / 2, 0.5),
        generator=torch.Generator().manual_seed(2),
    )
    assert abs(whitened.log_z) < 4 * whitened.standard_error + 1e-3, whitened
    with pytest.raises(InputError, match="give bounds or base, not both"):
        ais(target, n_chains=4, n_temperatures=2, bounds=(-1.0, 1.0), base=_mixture_base(means, 1.0))
