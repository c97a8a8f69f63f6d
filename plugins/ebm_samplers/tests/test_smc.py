"""Adaptive tempered SMC against exact log evidences, and its resampling schemes.

Tolerances come from the reported standard error: the estimate must be within 4 SE of the exact ``log Z``, and the SE
itself is bounded above (a huge SE would make the check empty) and below (zero would make it impossible). The SE is
the perfect-mixing approximation (``ebm_samplers.smc``); over 20 seeds with these settings the z-scores
``(estimate − exact)/SE`` had a standard deviation of 0.9–1.3, so 4 SE is about 3 true standard deviations at worst.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from ebmcore import EnergyModel, GaussianEnergy, GaussianMixtureEnergy
from ebmcore.errors import InputError
from ebm_samplers import resampling
from ebm_samplers.smc import adaptive_tempered_smc, ess_fraction, next_beta
from ebm_samplers.tempered_path import GaussianBase, TemperedEnergy
from sampler_problems import gaussian_with_log_z


class _Shifted(EnergyModel):
    """``E(x) + c``: ``log Z`` moves by ``−c``."""

    def __init__(self, energy: EnergyModel, c: float) -> None:
        super().__init__()
        self.inner, self.c = energy, c
        self.event_shape = energy.event_shape

    def compute_energy(self, x: Tensor) -> Tensor:
        return self.inner.compute_energy(x) + self.c

    def compute_gradient(self, x: Tensor, create_graph: bool = False) -> Tensor:
        return self.inner.compute_gradient(x, create_graph)


def _mixture(d: int) -> tuple[EnergyModel, float]:
    """``0.7·N(4·1, 0.5²I) + 0.3·N(−4·1, 0.5²I)`` times ``e^{-2}``: exact ``log Z = −2``."""
    means = torch.stack([torch.full((d,), 4.0), torch.full((d,), -4.0)]).double()
    mixture = GaussianMixtureEnergy(means, stds=torch.tensor([0.5, 0.5]).double(), weights=torch.tensor([0.7, 0.3]).double())
    return _Shifted(mixture, 2.0), -2.0


@pytest.mark.parametrize("d, kernel", [(2, "mala"), (10, "mala"), (10, "hmc")])
def test_log_evidence_of_gaussians(d, kernel):
    energy, exact = gaussian_with_log_z(d, seed=d)
    r = adaptive_tempered_smc(energy, 1000, scale=4.0, kernel=kernel, generator=torch.Generator().manual_seed(1))
    assert 0.01 < r.log_evidence_se < 0.1
    assert abs(r.log_evidence - exact) < 4 * r.log_evidence_se, (r.log_evidence, exact, r.log_evidence_se)
    assert r.particles.shape == (1000, d) and r.log_weights.shape == (1000,)
    assert float(torch.logsumexp(r.log_weights, 0)) == pytest.approx(0.0, abs=1e-9)
    assert r.betas[0] == 0.0 and r.betas[-1] == 1.0 and all(b > a for a, b in zip(r.betas, r.betas[1:]))
    # every stage but the last keeps the ESS at target_ess·n; the last keeps at least that
    assert all(e == pytest.approx(500, rel=1e-6) for e in r.ess[:-1]) and r.ess[-1] >= 500 * (1 - 1e-6)
    assert len(r.acceptance) == len(r.step_sizes) == r.n_stages - 1
    assert all(0.2 < a < 1.0 for a in r.acceptance)
    mean = (r.log_weights.exp()[:, None] * r.particles).sum(0)  # the particles are from the target
    torch.testing.assert_close(mean, energy.mean, atol=0.2, rtol=0)


@pytest.mark.parametrize("d", [1, 2])
def test_log_evidence_and_mode_weights_of_a_separated_mixture(d):
    """Modes at ±4 (σ 0.5, weights 0.7/0.3) from a base N(0, 4²): each run's ``log Z`` within 4 of its SEs; the weight
    of the mode at +4, from the weighted particles, within 3 SE of 0.7, the SE from 8 independent runs (their spread:
    the particles of one run are correlated through resampling, so their binomial SE would be too small)."""
    energy, exact = _mixture(d)
    weights = []
    for seed in range(8):
        r = adaptive_tempered_smc(energy, 1000, scale=4.0, generator=torch.Generator().manual_seed(seed))
        assert 0.01 < r.log_evidence_se < 0.1
        assert abs(r.log_evidence - exact) < 4 * r.log_evidence_se, (seed, r.log_evidence, exact, r.log_evidence_se)
        weights.append(float((r.log_weights.exp() * (r.particles[:, 0] > 0)).sum()))
    w = torch.tensor(weights, dtype=torch.float64)
    se = float(w.std()) / math.sqrt(len(w))
    assert 0.002 < se < 0.03
    assert abs(float(w.mean()) - 0.7) < 3 * se, (weights, se)


@pytest.mark.parametrize("kernel", ["hmc", "nuts"])
def test_other_registered_kernels_move_the_particles(kernel):
    energy, exact = gaussian_with_log_z(3, seed=3)
    r = adaptive_tempered_smc(
        energy,
        400,
        scale=4.0,
        kernel=kernel,
        kernel_params={"max_tree_depth": 4} if kernel == "nuts" else None,
        n_mcmc_steps=2,
        resampling="residual",
        generator=torch.Generator().manual_seed(0),
    )
    assert abs(r.log_evidence - exact) < 4 * r.log_evidence_se and r.kernel == kernel and r.resampling == "residual"


def test_a_base_object_and_the_tempered_energy():
    """Any object with ``sample``/``log_prob`` is a base; with the target itself as base, one stage, exact ``log Z = 0``."""
    loc, scale = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([0.5, 2.0], dtype=torch.float64)

    class Dist:  # torch.distributions with sample(n, generator) and an autograd gradient
        def sample(self, n, generator):
            return loc + scale * torch.randn((n, 2), generator=generator, dtype=torch.float64)

        def log_prob(self, x):
            return torch.distributions.Normal(loc, scale).log_prob(x).sum(1)

    energy = GaussianEnergy(loc, covariance=torch.diag(scale**2))
    normalised = _Shifted(energy, 0.5 * 2 * math.log(2 * math.pi) + float(scale.log().sum()))
    r = adaptive_tempered_smc(normalised, 64, base=Dist(), generator=torch.Generator().manual_seed(0))
    assert r.betas == [0.0, 1.0] and abs(r.log_evidence) < 1e-9 and r.log_evidence_se < 1e-6
    base = GaussianBase(loc, scale)
    x = base.sample(5, torch.Generator().manual_seed(0))
    tempered = TemperedEnergy(energy, base, beta=0.3)
    e, g = tempered.bind(x).energy_and_gradient(x)
    torch.testing.assert_close(e, 0.3 * energy.energy(x) - 0.7 * base.log_prob(x))
    torch.testing.assert_close(g, 0.3 * energy.gradient(x) + 0.7 * (x - loc) / scale**2)


def test_the_bisection_hits_target_ess():
    g = torch.Generator().manual_seed(0)
    u = 10 * torch.randn(500, generator=g, dtype=torch.float64)
    log_w = torch.full((500,), -math.log(500), dtype=torch.float64)
    beta = next_beta(log_w, u, 0.2, 0.5)
    assert 0.2 < beta < 1.0
    assert float(ess_fraction(log_w, u, torch.tensor(beta - 0.2, dtype=torch.float64))) == pytest.approx(0.5, abs=1e-9)
    assert next_beta(log_w, torch.zeros(500, dtype=torch.float64), 0.2, 0.5) == 1.0  # flat increments: straight to 1
    assert next_beta(log_w, 1e9 * u, 0.2, 0.5, min_step=1e-3) == pytest.approx(0.201)  # the minimum step


@pytest.mark.parametrize("scheme", list(resampling.SCHEMES))
def test_resampling_is_unbiased(scheme):
    """Over 20,000 batched draws each index's mean count is ``n·w`` (within 4 SE of the mean count)."""
    w = torch.tensor([0.03, 0.41, 0.17, 0.25, 0.14], dtype=torch.float64)
    n, draws = 10, 20_000
    idx = resampling.SCHEMES[scheme](w.expand(draws, 5), n, torch.Generator().manual_seed(0))
    assert idx.shape == (draws, n) and idx.dtype == torch.long
    counts = torch.nn.functional.one_hot(idx, 5).sum(1).double()
    se = counts.std(0) / math.sqrt(draws)
    assert ((counts.mean(0) - n * w).abs() <= 4 * se + 1e-12).all(), (counts.mean(0), n * w, se)


def test_stratified_systematic_and_residual_vary_less_than_multinomial():
    w = torch.tensor([0.03, 0.41, 0.17, 0.25, 0.14], dtype=torch.float64).expand(20_000, 5)
    var = {
        name: float(torch.nn.functional.one_hot(f(w, 10, torch.Generator().manual_seed(1)), 5).sum(1).double().var(0).sum())
        for name, f in resampling.SCHEMES.items()
    }
    assert var["multinomial"] == pytest.approx(10 * (1 - float((w[0] ** 2).sum())), rel=0.05)  # Σ n·w(1−w)
    for name in ("systematic", "stratified", "residual"):
        assert var[name] < 0.5 * var["multinomial"], var


def test_bad_inputs_are_input_errors():
    energy, _ = gaussian_with_log_z(2, seed=0)
    with pytest.raises(InputError, match="n_particles must be an integer >= 2"):
        adaptive_tempered_smc(energy, 1)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(InputError, match=r"target_ess must be a number in \(0, 1\)"):
            adaptive_tempered_smc(energy, 10, target_ess=bad)
    with pytest.raises(InputError, match="resampling must be one of systematic, stratified, multinomial, residual"):
        adaptive_tempered_smc(energy, 10, resampling="bogus")
    with pytest.raises(InputError, match="cannot move SMC particles"):
        adaptive_tempered_smc(energy, 10, kernel="langevin")
    with pytest.raises(InputError, match="max_stages"):
        adaptive_tempered_smc(energy, 100, scale=100.0, max_stages=2, generator=torch.Generator().manual_seed(0))

    class Boxed(EnergyModel):  # +inf outside the unit box: a standard normal base lands outside
        event_shape = (2,)

        def compute_energy(self, x: Tensor) -> Tensor:
            inside = (x.abs() <= 1).all(1)
            return 0.5 * (x * x).sum(1) + torch.where(inside, torch.zeros_like(x[:, 0]), torch.full_like(x[:, 0], math.inf))

    with pytest.raises(InputError, match=r"not finite at \d+ of 50 initial particles"):
        adaptive_tempered_smc(Boxed(), 50, generator=torch.Generator().manual_seed(0))
