"""Warm-up adaptation: Stan's windows, dual averaging, Welford variances, and adapted samplers reaching their targets."""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import DualAveraging, HMCSampler, MALASampler, NUTSSampler, WelfordVariance, stan_windows, warmup
from ebmcore.errors import InputError
from sampler_problems import correlated_gaussian, x0_of, assert_moments


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
    build = {"mala": lambda: MALASampler(energy, step_size=0.05),
             "hmc": lambda: HMCSampler(energy, step_size=0.05, n_leapfrog_steps=5),
             "nuts": lambda: NUTSSampler(energy, step_size=0.05, max_tree_depth=6)}[name]
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
