"""Adaptive tempered SMC against exact log evidences, and its resampling schemes.

Tolerances come from the reported standard error: the estimate must be within 4 SE of the exact ``log Z``, and the SE
itself is bounded above (a huge SE would make the check empty) and below (zero would make it impossible). The SE is
the perfect-mixing approximation (``ebm_samplers.smc``); over 20 seeds with these settings the z-scores
``(estimate − exact)/SE`` had a standard deviation of 0.9–1.3, so 4 SE is about 3 true standard deviations at worst.
The multimodal energies of the benchmark workloads (the double well in 1 and 2 dimensions) are checked mode by mode,
against NUTS chains that start in one mode.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import ebmcore
from ebmcore import EnergyModel, GaussianEnergy, GaussianMixtureEnergy
from ebmcore.errors import InputError
from ebm_samplers import NUTSSampler, resampling
from ebm_samplers.adaptation import warmup
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


def _double_well_log_z(d: int, barrier: float) -> float:
    """``log ∫ exp(−barrier·Σᵢ(xᵢ² − 1)²) dx``: ``d`` times the 1-d integral, by the trapezoidal rule on ``[−4, 4]``
    (the integrand is below ``e^{−225·barrier}`` outside)."""
    x = torch.linspace(-4.0, 4.0, 400_001, dtype=torch.float64)
    return d * math.log(float(torch.trapezoid(torch.exp(-barrier * (x * x - 1) ** 2), x)))


def _orthant_weights(particles: Tensor, weights: Tensor) -> Tensor:
    """The weight in each of the ``2^d`` orthants of ``particles: (n, d)`` (the double well's modes): ``(2^d,)``."""
    d = particles.shape[1]
    code = ((particles > 0).long() * 2 ** torch.arange(d)).sum(1)
    return torch.zeros(2**d, dtype=torch.float64).index_add_(0, code, weights.double())


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("barrier", [1.0, 10.0])
def test_every_mode_of_the_workload_double_wells_with_its_weight(d, barrier):
    """The multimodal energies of the acceptance workloads (docs: WORKLOADS.md), ``Σᵢ (xᵢ² − 1)²`` in 1 and 2
    dimensions (2 and 4 modes, equal weights), and the same with a barrier of 10 (``e^{-10}`` between the modes).
    Over 16 runs of 1000 particles from ``N(0, 2²)``: each ``log Z`` within 4 of its SEs, their mean within 3 SE of the
    exact value, and each mode's weight within 3 SE (the spread of the 16 runs) of ``1/2^d``."""
    energy, exact = ebmcore.energy("double_well", dim=d, barrier=barrier).double(), _double_well_log_z(d, barrier)
    estimates, ses, modes = [], [], []
    for seed in range(16):
        r = adaptive_tempered_smc(energy, 1000, scale=2.0, generator=torch.Generator().manual_seed(seed))
        assert 0.01 < r.log_evidence_se < 0.1
        assert abs(r.log_evidence - exact) < 4 * r.log_evidence_se, (seed, r.log_evidence, exact, r.log_evidence_se)
        estimates.append(r.log_evidence)
        ses.append(r.log_evidence_se)
        modes.append(_orthant_weights(r.particles, r.log_weights.exp()))
    pooled_se = math.sqrt(sum(se**2 for se in ses)) / len(ses)
    assert abs(sum(estimates) / len(estimates) - exact) < 3 * pooled_se, (estimates, exact, pooled_se)
    w = torch.stack(modes)
    se = w.std(0) / math.sqrt(len(w))
    assert (se < 0.03).all() and ((w.mean(0) - 1 / 2**d).abs() < 3 * se).all(), (w.mean(0), se)


@pytest.mark.parametrize("d", [1, 2])
def test_nuts_chains_started_in_one_mode_of_the_barrier_10_double_well_stay_there(d):
    """Against the test above: 200 NUTS chains started near ``(1, ..., 1)``, warmed up (300 steps) and run 300 more,
    keep 93 % (1-d) and 97 % (2-d) of their draws in the starting mode of ``10·Σᵢ (xᵢ² − 1)²``, whose weight is
    ``1/2^d``. With the workloads' barrier of 1 they cross, and the same run keeps 0.515 (1-d) and 0.22 (2-d) there,
    near the weights 0.5 and 0.25: on those energies a NUTS population finds every mode too."""
    energy = ebmcore.energy("double_well", dim=d, barrier=10.0).double()
    g = torch.Generator().manual_seed(1)
    x0 = 1.0 + 0.1 * torch.randn(200, d, generator=g, dtype=torch.float64)
    sampler = NUTSSampler(energy)
    tuned = warmup(sampler, x0, 300, target_accept=0.8, generator=g)
    x = sampler.sample(tuned.x, 300, generator=g, **tuned.tunables)
    assert float((x > 0).all(1).double().mean()) > 0.8 > 1 / 2**d
