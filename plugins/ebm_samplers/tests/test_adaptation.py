"""Warm-up adaptation: Stan's windows, dual averaging, Welford variances, and adapted samplers reaching their targets."""

import math

import pytest
import torch

import ebmcore
from ebmcore import diagnostics
from ebm_samplers import DualAveraging, HMCSampler, MALASampler, NUTSSampler, WelfordVariance, stan_windows, warmup
from ebmcore.errors import InputError
from sampler_problems import correlated_gaussian, kid_score_regression, x0_of, assert_moments


def test_stan_windows():
    assert stan_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert stan_windows(100) == [(15, 90)]
    assert stan_windows(10) == []


def test_dual_averaging_converges_on_a_known_acceptance_curve():
    """With acceptance exp(−h) the target 0.8 is reached at h = −log 0.8 ≈ 0.223."""
    averager = DualAveraging(1.0, target=0.8)
    h = 1.0
    for _ in range(2000):
        h = averager.update(math.exp(-h))
    assert averager.final() == pytest.approx(-math.log(0.8), rel=0.02)


def test_welford_pooled_and_per_chain():
    g = torch.Generator().manual_seed(0)
    pooled, per_chain = WelfordVariance(pooled=True), WelfordVariance(pooled=False)
    draws = torch.randn(200, 50, 3, generator=g, dtype=torch.float64) * torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    for x in draws:
        pooled.update(x)
        per_chain.update(x)
    torch.testing.assert_close(pooled.variance(regularize=False), draws.reshape(-1, 3).var(0))
    torch.testing.assert_close(per_chain.variance(regularize=False), draws.var(0))


@pytest.mark.parametrize("name", ["mala", "hmc", "nuts"])
def test_adapted_samplers_reach_the_target_acceptance_and_the_right_moments(name):
    energy = correlated_gaussian()
    build = {
        "mala": lambda: MALASampler(energy, step_size=0.05),
        "hmc": lambda: HMCSampler(energy, step_size=0.05, n_leapfrog_steps=5),
        "nuts": lambda: NUTSSampler(energy, step_size=0.05, max_tree_depth=6),
    }[name]
    sampler = build()
    target = 0.6 if name == "mala" else 0.8
    g = torch.Generator().manual_seed(4)
    tuned = warmup(sampler, x0_of(1000, 10), 300, target_accept=target, generator=g)
    assert abs(tuned.acceptance - target) < 0.05, f"{name}: acceptance {tuned.acceptance:.3f} vs target {target}"
    extra = {"inv_mass": tuned.inv_mass} if tuned.inv_mass is not None else {}
    result = sampler.sample(tuned.x, 100, step_size=tuned.step_size, return_diagnostics=True, generator=g, **extra)
    assert abs(float(result.diagnostics.acceptance_rate.mean()) - target) < 0.05
    assert_moments(result.samples, energy.mean, energy.covariance, f"adapted {name}")
    if tuned.inv_mass is not None:  # the diagonal of Σ, within the estimation error of the warm-up windows
        assert torch.allclose(tuned.inv_mass, energy.covariance.diagonal(), rtol=0.15)


def test_per_chain_adaptation_and_bad_warmups():
    energy = ebmcore.energy("gaussian", dim=2)
    tuned = warmup(MALASampler(energy), torch.randn(64, 2), 200, pooled=False, generator=torch.Generator().manual_seed(0))
    assert isinstance(tuned.step_size, torch.Tensor) and tuned.step_size.shape == (64,)
    from ebm_samplers import LangevinSampler

    with pytest.raises(InputError, match="no acceptance statistic"):
        warmup(LangevinSampler(energy), torch.randn(8, 2), 10)
    with pytest.raises(InputError, match="has no mass matrix to adapt"):
        warmup(MALASampler(energy), torch.randn(8, 2), 10, adapt_mass=True)


def test_warmup_builds_no_graph_and_checks_its_arguments():
    energy = ebmcore.energy("gaussian", dim=2)
    tuned = warmup(MALASampler(energy), torch.randn(64, 2, requires_grad=True), 30)
    assert not tuned.x.requires_grad and tuned.x.grad_fn is None
    assert set(tuned.tunables) == {"step_size"} and tuned.params.step_size == tuned.step_size
    with pytest.raises(InputError, match="generator must be a torch.Generator"):
        warmup(MALASampler(energy), torch.randn(8, 2), 10, generator=3)


def _warm_then_sample(sampler, n_chains, n_warmup, n_draws, pooled, seed=1):
    """Warm-up from Stan's default starts, uniform in (−2, 2) (far from a posterior of intercept ≈ 24 and
    slope ≈ 0.58 ± 0.06), then the trajectory ``(n_draws, n_chains, d)`` with the tuned step size and mass."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.rand(n_chains, sampler.energy.event_shape[0], generator=g, dtype=torch.float64) * 4 - 2
    tuned = warmup(sampler, x0, n_warmup, pooled=pooled, generator=g)
    assert isinstance(tuned.step_size, float) == pooled
    return sampler.sample(tuned.x, n_draws, return_trajectory=True, generator=g, **tuned.tunables).trajectory


def _assert_posterior(draws, mean, sd, what, max_rhat=1.02):
    """R-hat below ``max_rhat``; the mean within 4 Monte Carlo standard errors (sd/√ESS) of the exact one, and the
    standard deviation within 4 of its own (about sd/√(2·ESS))."""
    rhat, ess = diagnostics.split_rhat(draws), diagnostics.ess_bulk(draws)
    flat = draws.reshape(-1, draws.shape[-1])
    z_mean = (flat.mean(0) - mean) / (sd / ess.sqrt())
    z_sd = (flat.std(0) / sd - 1) * (2 * ess).sqrt()
    assert rhat.max() < max_rhat and z_mean.abs().max() < 4 and z_sd.abs().max() < 4, (
        f"{what}: R-hat {rhat.tolist()}, ESS {ess.tolist()}, mean off by {z_mean.tolist()} and sd by {z_sd.tolist()} "
        f"standard errors (sd ratio {(flat.std(0) / sd).tolist()})"
    )


@pytest.mark.parametrize("pooled", [True, False])
def test_warmup_on_an_unstandardised_regression_matches_the_closed_form_posterior(pooled):
    # Pooling the draws of chains that had not met folded their spread into the metric: R-hat 1.7 and standard
    # deviations 13-42x too wide here; with each chain's own variances, combined by their median, it matches.
    energy, mean, sd = kid_score_regression()  # intercept, two slopes, log σ: σ unknown, Student-t / log-χ² marginals
    draws = _warm_then_sample(HMCSampler(energy, n_leapfrog_steps=16), 8, 400, 400, pooled)
    _assert_posterior(draws, mean, sd, f"HMC, pooled={pooled}")


def test_warmup_on_a_known_sigma_regression_matches_the_exact_gaussian():
    energy, mean, sd = kid_score_regression(sigma=18.0)  # β ~ N(β̂, σ²(XᵀX)⁻¹): correlation −0.99, scales 6 to 0.06
    _assert_posterior(_warm_then_sample(HMCSampler(energy, n_leapfrog_steps=16), 8, 400, 400, True), mean, sd, "HMC")


@pytest.mark.slow
@pytest.mark.parametrize("pooled", [True, False])
def test_nuts_default_warmup_on_the_regression_as_reported(pooled):
    # the configuration of the report: NUTS, 10 chains x 1000 warm-up x 1000 draws (R-hat 1.16 to 1.4 before)
    energy, mean, sd = kid_score_regression()
    _assert_posterior(
        _warm_then_sample(NUTSSampler(energy), 10, 1000, 1000, pooled), mean, sd, f"NUTS, pooled={pooled}", max_rhat=1.01
    )


def test_warmup_of_a_plain_sampler_with_accepted_names_the_field_it_needs():
    # a third-party core sampler whose info has `accepted` (the run reports its acceptance): warm-up says what it reads
    import ebmcore.sampler
    from ebm_samplers import cannot_warm_up

    class RandomWalk(ebmcore.Sampler):
        def init(self, x):
            return type("S", (), {"x": x})()

        def step(self, state, *, generator=None, step_size=0.5):
            return state, type("I", (), {"accepted": torch.ones(state.x.shape[0], dtype=torch.bool)})()

    why = cannot_warm_up(RandomWalk(ebmcore.energy("gaussian", dim=2)))
    assert why.startswith("RandomWalk is a plain ebmcore.Sampler") and "info.acceptance_prob" in why
    assert "info.accepted" in why and "give step_size yourself" in why
    with pytest.raises(InputError, match=r"info\.acceptance_prob"):
        warmup(RandomWalk(ebmcore.energy("gaussian", dim=2)), torch.randn(8, 2), 10)
