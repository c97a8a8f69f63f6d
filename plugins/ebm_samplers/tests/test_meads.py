"""MEADS: the warm-up finds the scales, step size and damping the curvature predicts, the frozen sampler matches the
target's moments within the errors its ESS implies, it beats HMC with a short fixed trajectory per gradient, each
fold is tuned from another fold only, and the sampler's contract (divergences, errors, registration, reproducibility).

Targets: a 10-d Gaussian with independent scales ``σ_i`` log-spaced from 0.1 to 10 (condition number 10⁴), and a 2-d
Gaussian with scales 1 and 3 and correlation 0.95. After preconditioning by the scales, the 10-d target is the
identity: the largest eigenvalue of the preconditioned Hessian is 1, so ``h = 0.5/√1 = 0.5`` and ``γ = 1``. The 2-d
target's correlation matrix has eigenvalues ``1 ± 0.95``; the estimate ``Σλ²/Σλ`` of the largest eigenvalue is
``19.51`` for its inverse (``h = 0.113``) and ``1.90`` for itself (``γ = 0.725``). Estimated from 128 chains, over
seeds 0–9 the 10-d step size ended at 0.47–0.51, the scales within 0.78–1.18 of the true ones, and the 2-d step size
at 0.096–0.133 (±17 %), its damping at 0.728–0.742; the tests allow ±30 % for the step sizes. Over those seeds no
moment was further than 2.6 SE from the truth (the tests allow 5).
"""

from __future__ import annotations

import math

import pytest
import torch

import ebmcore
from ebmcore import EnergyModel
from ebmcore.diagnostics import ess_mean
from ebmcore.errors import InputError, NonFiniteError
from ebm_samplers import HMCSampler, MEADSSampler, meads, meads_warmup
from ebm_samplers.meads_adaptation import ensemble_parameters, fold_parameters, maximum_eigenvalue

D, CHAINS = 10, 128
SCALES = torch.logspace(-1, 1, D, dtype=torch.float64)
COVARIANCE = torch.tensor([[1.0, 0.95 * 3.0], [0.95 * 3.0, 9.0]], dtype=torch.float64)


def _gaussian(covariance: torch.Tensor) -> ebmcore.GaussianEnergy:
    return ebmcore.GaussianEnergy(torch.zeros(covariance.shape[0], dtype=torch.float64), covariance=covariance)


def _tune_and_sample(energy, seed: int, n_draws: int, **options):
    """300 MEADS iterations of 128 chains from N(0, I), then ``n_draws`` with the tunables frozen."""
    g = torch.Generator().manual_seed(seed)
    sampler = MEADSSampler(energy, **options)
    d = energy.event_shape[0]
    result = meads_warmup(sampler, torch.randn(CHAINS, d, generator=g, dtype=torch.float64), 300, generator=g)
    run = sampler.sample(result.x, n_draws, return_trajectory=True, return_diagnostics=True, generator=g, **result.tunables)
    return sampler, result, run


@pytest.fixture(scope="module")
def tuned():
    return _tune_and_sample(_gaussian(torch.diag(SCALES**2)), 0, 500)


def _assert_moments_within_ess(x: torch.Tensor, covariance: torch.Tensor) -> None:
    """Per coordinate: the mean within 5 SE, ``SE = σ/√ESS``; the mean of ``x²`` within 5 SE of ``σ²``,
    ``SE = √2·σ²/√ESS(x²)`` (``Var x² = 2σ⁴`` for a centred Gaussian); for two coordinates, the mean of ``x₁x₂``
    within 5 SE of ``c₁₂``, ``SE = √(σ₁²σ₂² + c₁₂²)/√ESS(x₁x₂)``. ESS by the multi-chain estimator."""
    var = covariance.diagonal()
    ess, ess_sq = ess_mean(x), ess_mean(x**2)
    assert float(ess.min()) > 2000 and float(ess_sq.min()) > 1000  # the bounds below are not vacuous
    mean = x.mean((0, 1))
    assert ((mean.abs() / (var.sqrt() / ess.sqrt())) < 5).all(), mean / var.sqrt()
    second = (x**2).mean((0, 1))
    assert (((second - var).abs() / (math.sqrt(2) * var / ess_sq.sqrt())) < 5).all(), second / var
    if x.shape[-1] == 2:
        product = x[..., :1] * x[..., 1:]
        c = float(covariance[0, 1])
        se = math.sqrt(float(var[0] * var[1]) + c * c) / float(ess_mean(product).sqrt())
        assert abs(float(product.mean()) - c) < 5 * se, (float(product.mean()), c)


def test_warmup_finds_the_scales_the_step_size_and_the_damping(tuned):
    _, result, run = tuned
    # σ from 128 chains: relative SE 1/√256 = 6 %; 5 SE either way
    ratio = result.inv_mass.sqrt() / SCALES
    assert ((ratio > 0.69) & (ratio < 1.31)).all(), ratio
    assert 0.35 < result.step_size < 0.65  # 0.5/√λ with λ = 1 for the preconditioned identity
    assert 0.8 < result.damping < 1.25  # 1/√λ of the preconditioned covariance, λ = 1
    # from N(0, I) the gradients see scale 0.1 unpreconditioned: a tiny step and heavy damping (the floor 1/(t·h))
    assert result.step_sizes[0] < 0.02 and result.dampings[0] > 50
    assert len(result.step_sizes) == len(result.dampings) == 300
    assert result.n_gradient_evaluations == 300
    assert result.acceptance > 0.9 and float(run.diagnostics.acceptance_rate.mean()) > 0.9
    assert int(run.diagnostics.divergences.sum()) == 0
    assert result.params.step_size == result.step_size and result.params.inv_mass is result.inv_mass


def test_frozen_sampler_matches_the_gaussian_within_its_ess(tuned):
    _assert_moments_within_ess(tuned[2].trajectory, torch.diag(SCALES**2))


def test_more_effective_samples_per_gradient_than_hmc_with_a_short_fixed_trajectory(tuned):
    """Worst coordinate's ESS per gradient. HMC runs identity mass at h = 0.1 (acceptance ≈ 0.8 here; leapfrog is
    unstable beyond 2·σ_min = 0.2) with 5 leapfrog steps: a random walk along σ = 10. Measured: MEADS 0.16–0.18 (one
    gradient per draw), HMC 2–3e-4, a ratio of 570–760 over seeds 0–9. The test asks for 50. (The ratio is mostly
    the preconditioner's: HMC with MEADS's own σ and step size and 5 steps reached 0.9.)"""
    sampler, result, run = tuned
    meads_rate = float(ess_mean(run.trajectory).min()) / (500 * CHAINS)
    n, steps = 1000, 5
    hmc = HMCSampler(sampler.energy, step_size=0.1, n_leapfrog_steps=steps)
    x = hmc.sample(result.x, n, return_trajectory=True, generator=torch.Generator().manual_seed(1)).trajectory
    hmc_rate = float(ess_mean(x).min()) / (n * steps * CHAINS)
    assert meads_rate > 50 * hmc_rate, (meads_rate, hmc_rate)


@pytest.mark.parametrize("nonreversible, seed", [(True, 1), (False, 2)])
def test_correlated_gaussian(nonreversible, seed):
    _, result, run = _tune_and_sample(_gaussian(COVARIANCE), seed, 1000, nonreversible=nonreversible)
    assert result.params.nonreversible is nonreversible
    inverse = torch.linalg.eigvalsh(torch.tensor([[1.0, 0.95], [0.95, 1.0]], dtype=torch.float64)).reciprocal()
    expected_h = 0.5 / math.sqrt(float((inverse**2).sum() / inverse.sum()))
    assert expected_h == pytest.approx(0.1132, abs=1e-4)
    assert expected_h / 1.3 < result.step_size < 1.3 * expected_h, (result.step_size, expected_h)
    assert result.damping == pytest.approx(1 / math.sqrt(1.9025), rel=0.15)
    assert int(run.diagnostics.divergences.sum()) == 0
    _assert_moments_within_ess(run.trajectory, COVARIANCE)


def test_each_fold_is_tuned_from_the_fold_before_it_never_from_itself():
    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(12, 3, generator=g, dtype=torch.float64), torch.randn(12, 3, generator=g, dtype=torch.float64)
    folds = list(torch.randperm(12, generator=g).tensor_split(3))
    before = ensemble_parameters(x, grad, folds, 5)
    for k in range(3):  # move fold k's chains: only fold k + 1's parameters change
        moved_x, moved_grad = x.clone(), grad.clone()
        moved_x[folds[k]] *= 3.0
        moved_grad[folds[k]] += 1.0
        after = ensemble_parameters(moved_x, moved_grad, folds, 5)
        for j in range(3):
            same = all(torch.equal(b[folds[j]], a[folds[j]]) for b, a in zip(before, after))
            assert same is (j != (k + 1) % 3), (k, j)
    h, gamma, sigma = fold_parameters(x[folds[0]], grad[folds[0]], 5)
    assert torch.equal(before[0][folds[1]], h.expand(4)) and torch.equal(before[2][folds[1]], sigma.expand(4, 3))
    assert float(gamma) >= 1 / (5 * float(h))  # the damping floor s/(t·h)


def test_the_largest_eigenvalue_estimate():
    v = torch.tensor([3.0, 4.0], dtype=torch.float64)
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0], dtype=torch.float64)[:, None]
    assert float(maximum_eigenvalue(signs * v)) == pytest.approx(25.0)  # ‖v‖² for z = ±v
    # N(0, diag(9, 1, 1)): Σλ²/Σλ = 83/11, between the mean eigenvalue and the largest
    z = torch.randn(4000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * torch.tensor([3.0, 1, 1])
    assert float(maximum_eigenvalue(z)) == pytest.approx(83 / 11, rel=0.08)
    # the step size of a fold on N(0, diag(σ²)) preconditions to 0.5; with no spread σ = 1 and h = 1 at most
    x = z * 0.1
    h, gamma, sigma = fold_parameters(x, x / (0.01 * torch.tensor([9.0, 1, 1])), 1000)
    assert float(h) == pytest.approx(0.5, rel=0.08) and float(gamma) == pytest.approx(1.0, rel=0.08)
    h, _, sigma = fold_parameters(torch.ones(4, 3), torch.zeros(4, 3), 1)
    assert float(h) == 1.0 and torch.equal(sigma, torch.ones(3))


class _Walled(EnergyModel):
    """``½|x|²`` for ``x₀ < 1``, NaN beyond: every proposal past the wall is non-finite."""

    event_shape = (2,)

    def compute_energy(self, x):
        return torch.where(x[:, 0] < 1.0, 0.5 * (x**2).sum(1), torch.full_like(x[:, 0], float("nan")))


def test_nonfinite_proposals_are_rejected_and_counted_as_divergences():
    energy = _Walled().double()
    g = torch.Generator().manual_seed(0)
    x0 = 0.3 * torch.randn(64, 2, generator=g, dtype=torch.float64)
    sampler = MEADSSampler(energy, step_size=0.5, damping=0.2)
    run = sampler.sample(x0, 200, return_diagnostics=True, generator=g)
    assert torch.isfinite(run.samples).all() and (run.samples[:, 0] < 1.0).all()
    assert int(run.diagnostics.divergences.sum()) > 0
    assert 0.05 < float(run.diagnostics.acceptance_rate.mean()) < 0.99
    # the warm-up carries on: a divergent proposal leaves the chain where it was
    result = meads_warmup(sampler, x0, 60, generator=g)
    assert torch.isfinite(result.x).all() and (result.x[:, 0] < 1.0).all()
    assert math.isfinite(result.step_size) and math.isfinite(result.damping) and torch.isfinite(result.inv_mass).all()


def test_the_first_step_draws_the_momentum_and_the_slice_variable():
    energy = ebmcore.energy("gaussian", dim=3)
    x = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
    fns = energy.bind(x)
    state = meads.init(x, fns)
    assert bool(state.fresh.all()) and not bool(state.momentum.any())
    step = meads.build_kernel()
    params = meads.Params(0.3, damping=0.01).resolve(x)  # α ≈ 0.006: the first momentum is all from the full draw
    s, info = step(state, fns, torch.Generator().manual_seed(1), params)
    assert not bool(s.fresh.any()) and info.n_gradient_evaluations == 1
    assert float(s.momentum.std()) == pytest.approx(1.0, abs=0.1)  # N(0, I), whitened
    assert float(s.slice.min()) >= -1 and float(s.slice.max()) < 1 and float(s.slice.std()) > 0.4  # U[−1, 1): 0.58
    before = s.momentum
    s, info = step(s, fns, torch.Generator().manual_seed(2), params)
    kept = torch.where(info.accepted[:, None], before, -before)  # kept (α ≈ 0.006), or reversed by a rejection
    assert float(torch.nn.functional.cosine_similarity(s.momentum.flatten(), kept.flatten(), dim=0)) > 0.8


def test_bad_parameters_raise_clear_errors():
    energy = ebmcore.energy("gaussian", dim=2)
    with pytest.raises(InputError, match="step_size must be a finite positive number"):
        MEADSSampler(energy, step_size=-0.1)
    with pytest.raises(InputError, match="damping must be a finite positive number"):
        MEADSSampler(energy, damping=0.0)
    with pytest.raises(InputError, match=r"slice_shift must be a number in \(0, 1\]"):
        MEADSSampler(energy, slice_shift=1.5)
    with pytest.raises(InputError, match="nonreversible must be True or False"):
        MEADSSampler(energy, nonreversible="yes")
    with pytest.raises(InputError, match="MEADSSampler takes a diagonal inv_mass"):
        MEADSSampler(energy, inv_mass=torch.eye(2) * 2).sample(torch.randn(8, 2), 2)
    sampler, x0 = MEADSSampler(energy), torch.randn(16, 2)
    with pytest.raises(InputError, match="n_folds must be an integer >= 2"):
        meads_warmup(sampler, x0, 10, n_folds=1)
    with pytest.raises(InputError, match="at least 2 chains per fold"):
        meads_warmup(sampler, x0[:7], 10)
    with pytest.raises(InputError, match="at least 2 chains per fold"):
        meads_warmup(sampler, x0[:1], 10, n_folds=2)
    with pytest.raises(InputError, match="n_warmup must be a positive integer"):
        meads_warmup(sampler, x0, 0)
    with pytest.raises(InputError, match=r"step_size_multiplier must be a number in \(0, 2\)"):
        meads_warmup(sampler, x0, 10, step_size_multiplier=2.5)
    with pytest.raises(InputError, match="damping_slowdown must be a finite positive number"):
        meads_warmup(sampler, x0, 10, damping_slowdown=0.0)
    with pytest.raises(InputError, match="give temperature as a number"):
        meads_warmup(MEADSSampler(energy, temperature=torch.ones(16)), x0, 10)
    with pytest.raises(InputError, match="meads_warmup tunes a MEADSSampler"):
        meads_warmup(HMCSampler(energy), x0, 10)
    bad = x0.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"first at rows \[3\]"):  # the error names the chain
        meads_warmup(sampler, bad, 10)


def test_registered_reproducible_and_usable_with_per_chain_parameters():
    energy = ebmcore.energy("gaussian", dim=2)
    assert ebmcore.registry.get("sampler", "meads").component is MEADSSampler
    x0 = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    runs = [MEADSSampler(energy, 0.4, 0.5).sample(x0, 20, generator=torch.Generator().manual_seed(4)) for _ in range(2)]
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    x = MEADSSampler(energy).sample(
        x0, 20, step_size=torch.linspace(0.1, 0.4, 32), damping=torch.linspace(0.5, 2, 32), inv_mass=torch.rand(32, 2) + 0.5
    )
    assert x.shape == (32, 2) and torch.isfinite(x).all()
    # ebm sample's hook: the algorithm's own warm-up (target_accept is not MEADS's to use)
    result = MEADSSampler.algorithm.warmup(MEADSSampler(energy), x0, 20, target_accept=0.8, generator=torch.Generator())
    assert result.x.shape == x0.shape and set(result.tunables) == {"step_size", "damping", "inv_mass"}
    assert 0 < result.acceptance <= 1
