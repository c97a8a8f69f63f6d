"""Each loss's value and gradient against closed forms on Gaussian energies."""

import math

import pytest
import torch

import ebmcore
from ebm_losses import (
    ContrastiveDivergence,
    DenoisingScoreMatching,
    NoiseContrastiveEstimation,
    ScoreMatching,
    SlicedScoreMatching,
)
from loss_problems import LearnableGaussian, random_spd

D = 3


def _data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    cov = random_spd(D, seed=5)
    mu = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    return mu + torch.randn(n, D, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T, mu, cov


def _model():
    return LearnableGaussian(torch.tensor([0.2, 0.1, -0.3], dtype=torch.float64), random_spd(D, seed=9))


def test_exact_score_matching_equals_the_closed_form_value_and_gradient():
    x, _, _ = _data(64)
    energy = _model()
    value = ScoreMatching()(energy, x)
    p, m = energy.precision, energy.mean
    expected = 0.5 * ((x - m) @ p).square().sum(1).mean() - torch.trace(p)  # ½|∇E|² − tr ∇²E, exactly per batch
    torch.testing.assert_close(value, expected)
    got = torch.autograd.grad(value, list(energy.parameters()))
    want = torch.autograd.grad(expected, list(energy.parameters()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _mc_close(estimates, target, what):
    """|mean − target| within 5 standard errors of the Monte Carlo mean."""
    estimates = torch.stack(estimates)
    se = estimates.std() / math.sqrt(len(estimates))
    assert abs(float(estimates.mean() - target)) < 5 * float(se) + 1e-9, (
        f"{what}: {float(estimates.mean()):.4f} vs {float(target):.4f} (se {float(se):.4f})"
    )


@pytest.mark.parametrize(
    "loss",
    [
        ScoreMatching("hutchinson"),
        ScoreMatching("hutchinson", probe="gaussian"),
        SlicedScoreMatching(projection="rademacher"),
        SlicedScoreMatching(projection="gaussian"),
        SlicedScoreMatching(projection="sphere"),
        SlicedScoreMatching(projection="gaussian", variance_reduction=True),
        SlicedScoreMatching(n_projections=4, projection="sphere", variance_reduction=True),
    ],
    ids=lambda l: (
        f"{type(l).__name__}-{getattr(l, 'projection', getattr(l, 'probe', ''))}-{getattr(l, 'variance_reduction', '')}"
    ),
)
def test_stochastic_estimators_agree_with_exact_score_matching_in_expectation(loss):
    x, _, _ = _data(32)
    energy = ebmcore.MLPEnergy(dim=D, hidden=(16,), seed=0, dtype=torch.float64)
    exact = ScoreMatching()(energy, x).detach()
    g = torch.Generator().manual_seed(0)
    _mc_close([loss(energy, x, generator=g).detach() for _ in range(400)], exact, type(loss).__name__)


def test_denoising_score_matching_expected_value_and_optimum():
    sigma = 0.5
    x, mu, cov = _data(200_000, seed=2)
    energy = _model()
    p, m = energy.precision.detach(), energy.mean.detach()
    b = sigma * p - torch.eye(D, dtype=torch.float64) / sigma
    # E ½|P(x + σε − m) − ε/σ|² = ½[tr(PΣP) + |P(μ − m)|² + tr(BᵀB)],  B = σP − I/σ
    expected = 0.5 * (torch.trace(p @ cov @ p) + (p @ (mu - m)).square().sum() + torch.trace(b.T @ b))
    values = [
        DenoisingScoreMatching(sigma)(energy, chunk, generator=torch.Generator().manual_seed(i)).detach()
        for i, chunk in enumerate(x.split(5000))
    ]
    _mc_close(values, expected, "DSM expected value")
    # at the optimum (m = μ, P = (Σ + σ²I)⁻¹) the expected gradient vanishes; elsewhere it does not
    optimum = LearnableGaussian(mu, torch.linalg.inv(cov + sigma**2 * torch.eye(D, dtype=torch.float64)))
    at_opt = torch.autograd.grad(
        DenoisingScoreMatching(sigma)(optimum, x, generator=torch.Generator().manual_seed(3)), [optimum.mean]
    )[0]
    away = torch.autograd.grad(
        DenoisingScoreMatching(sigma)(energy, x, generator=torch.Generator().manual_seed(3)), [energy.mean]
    )[0]
    assert at_opt.abs().max() < 0.02 and away.abs().max() > 0.3


def test_multi_level_dsm_weights_each_level_by_sigma_squared():
    x, _, _ = _data(50_000, seed=4)
    energy = _model()
    levels = [0.2, 1.0]
    multi = DenoisingScoreMatching(sigmas=levels)(energy, x, generator=torch.Generator().manual_seed(0))
    singles = [DenoisingScoreMatching(s)(energy, x, generator=torch.Generator().manual_seed(1)) * s**2 for s in levels]
    assert float(multi.detach()) == pytest.approx(float(sum(singles).detach() / 2), rel=0.03)


def test_nce_learns_the_log_normaliser():
    """With the energy fixed at the data's own unnormalised density, NCE's c converges to log Z."""
    energy = ebmcore.HarmonicEnergy(dim=2, dtype=torch.float64)  # E = ½|x|², log Z = log 2π
    data = torch.randn(20_000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    loss = NoiseContrastiveEstimation(noise_ratio=4)
    optimizer = torch.optim.Adam(loss.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for i in range(300):
        batch = data[torch.randint(0, 20_000, (1000,), generator=g)]
        optimizer.zero_grad()
        loss(energy, batch, generator=g).backward()
        optimizer.step()
    assert float(loss.log_normalizer.detach()) == pytest.approx(math.log(2 * math.pi), abs=0.05)


def test_contrastive_divergence_value_and_gradient():
    x, mu, _ = _data(4000, seed=6)
    energy = _model()
    loss = ContrastiveDivergence("hmc", n_steps=60, sampler_options={"step_size": 0.3, "n_leapfrog_steps": 5}, regularization=0.1)
    value = loss(energy, x, generator=torch.Generator().manual_seed(0))
    neg = loss.last_negatives
    e_pos, e_neg = energy.energy(x), energy.energy(neg)
    torch.testing.assert_close(value, e_pos.mean() - e_neg.mean() + 0.1 * (e_pos.square().mean() + e_neg.square().mean()))
    # without regularisation, long chains make ∂loss/∂m = P (m − μ_data) (data pull minus model push)
    loss.regularization = 0.0
    grad = torch.autograd.grad(loss(energy, x, generator=torch.Generator().manual_seed(0)), [energy.mean])[0]
    expected = energy.precision.detach() @ (energy.mean.detach() - x.mean(0))
    assert (grad - expected).abs().max() < 0.1 * expected.abs().max()


def test_dsm_trains_noise_conditional_energies():
    """For E(x, σ) = ½|x|²/(1 + σ²) (data N(0, I) smoothed by σ) the DSM gradient w.r.t. a scale vanishes."""

    class Conditional(ebmcore.EnergyModel):
        noise_conditional = True
        event_shape = (2,)

        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))

        def compute_energy(self, x, sigma):
            return 0.5 * self.scale * (x * x).sum(-1) / (1 + sigma**2)

    energy = Conditional()
    data = torch.randn(200_000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    loss = DenoisingScoreMatching(sigmas=[0.1, 0.5, 1.0])
    (grad,) = torch.autograd.grad(loss(energy, data, generator=torch.Generator().manual_seed(1)), [energy.scale])
    assert abs(float(grad)) < 0.02
    with torch.no_grad():
        energy.scale.fill_(2.0)
    (away,) = torch.autograd.grad(loss(energy, data, generator=torch.Generator().manual_seed(1)), [energy.scale])
    assert float(away) > 0.1
