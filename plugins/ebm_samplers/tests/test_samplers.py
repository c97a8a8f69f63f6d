"""Statistical correctness of the whole family, with tolerances derived from the number of chains.

All moment checks use the final state of N independent chains (one draw per chain), so the standard
error of a mean is sd/√N and of a covariance entry √((Σᵢᵢ Σⱼⱼ + Σᵢⱼ²)/N); we allow 5 standard errors.
"""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import HMCSampler, LangevinSampler, MALASampler
from sampler_problems import Banana, correlated_gaussian, double_well_moments, ula_stationary_covariance

N = 4000


def _x0(n, d, seed=0, dtype=torch.float64):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _assert_moments(x, mean, cov, what):
    n = x.shape[0]
    sd = cov.diagonal().sqrt()
    mean_err = (x.mean(0) - mean).abs() / (sd / math.sqrt(n))
    assert mean_err.max() < 5, f"{what}: mean off by {mean_err.max():.1f} standard errors"
    cov_hat = torch.cov(x.T)
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / n).sqrt()
    cov_err = ((cov_hat - cov).abs() / se).max()
    assert cov_err < 5, f"{what}: covariance off by {cov_err:.1f} standard errors"


FAMILY = {
    "mala": lambda e: MALASampler(e, step_size=0.3),
    "hmc": lambda e: HMCSampler(e, step_size=0.3, n_leapfrog_steps=6),
    "hmc-mclachlan": lambda e: HMCSampler(e, step_size=0.5, n_leapfrog_steps=4, integrator="mclachlan"),
    "hmc-yoshida": lambda e: HMCSampler(e, step_size=0.5, n_leapfrog_steps=3, integrator="yoshida"),
    "hmc-diagonal-mass": lambda e: HMCSampler(
        e, step_size=0.3, n_leapfrog_steps=6, inv_mass=torch.full((10,), 1.2, dtype=torch.float64)
    ),
    "hmc-dense-mass": lambda e: HMCSampler(e, step_size=0.6, n_leapfrog_steps=4, inv_mass=e.covariance),
}


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_exact_samplers_match_a_correlated_gaussian(name):
    energy = correlated_gaussian()
    x = FAMILY[name](energy).sample(_x0(N, 10), 300, burn_in=100, generator=torch.Generator().manual_seed(1))
    _assert_moments(x, energy.mean, energy.covariance, name)


def test_ula_matches_its_exact_finite_step_law():
    energy = correlated_gaussian()
    h = 0.3  # large enough that the O(h) bias is ~10 standard errors: the test separates bias from non-convergence
    x = LangevinSampler(energy, step_size=h).sample(_x0(N, 10), 400, generator=torch.Generator().manual_seed(2))
    _assert_moments(x, energy.mean, ula_stationary_covariance(energy, h), "ULA vs its finite-step law")
    cov_err = (torch.cov(x.T) - energy.covariance).abs().max()
    assert cov_err > 0.15, "at h=0.3 ULA must visibly differ from the target (else the test above proves nothing)"


@pytest.mark.parametrize("name", ["mala", "hmc"])
def test_double_well_against_quadrature(name):
    energy = ebmcore.energy("double_well", dim=2)
    sampler = MALASampler(energy, step_size=0.1) if name == "mala" else HMCSampler(energy, step_size=0.2, n_leapfrog_steps=5)
    # Chains start in the bulk: from the quartic tails (|x| > 2) MALA's proposals overshoot and are always
    # rejected -- MALA is not geometrically ergodic on light-tailed targets, a property of the algorithm.
    x0 = 0.5 * _x0(N, 2, dtype=torch.float32)
    x = sampler.sample(x0, 400, burn_in=100, generator=torch.Generator().manual_seed(3)).double()
    ref = double_well_moments()
    n = x.numel()  # the two coordinates are independent under this target
    for key, values in (("x2", x**2), ("abs", x.abs())):
        sd = math.sqrt((ref["x4"] if key == "x2" else ref["x2"]) - ref[key] ** 2)
        err = abs(values.mean().item() - ref[key]) / (sd / math.sqrt(n))
        assert err < 5, f"{name}: E[{key}] off by {err:.1f} standard errors"


@pytest.mark.parametrize("name", ["mala", "hmc"])
def test_banana_against_closed_form(name):
    energy = Banana().double()
    sampler = MALASampler(energy, step_size=0.15) if name == "mala" else HMCSampler(energy, step_size=0.15, n_leapfrog_steps=10)
    x = sampler.sample(_x0(N, 2), 600, burn_in=200, generator=torch.Generator().manual_seed(4))
    x1, x2 = x[:, 0], x[:, 1]
    se = lambda v: v.std().item() / math.sqrt(N)  # noqa: E731
    assert abs(x2.mean().item() - 1.0) < 5 * se(x2)
    assert abs(x2.var().item() - 3.0) < 5 * math.sqrt(2 * 3.0**2 / N) * 2  # heavy-ish tails: doubled allowance
    assert abs((x1**2 * x2).mean().item() - 3.0) < 5 * se(x1**2 * x2)


def test_temperature_scales_the_target():
    energy = correlated_gaussian()
    x = MALASampler(energy, step_size=0.3, temperature=2.0).sample(
        _x0(N, 10), 300, burn_in=100, generator=torch.Generator().manual_seed(5)
    )
    _assert_moments(x, energy.mean, 2.0 * energy.covariance, "MALA at T=2")


@pytest.mark.parametrize(
    "cls, kw",
    [
        (LangevinSampler, {"step_size": 0.01}),
        (MALASampler, {"step_size": 0.2}),
        (HMCSampler, {"step_size": 0.2, "n_leapfrog_steps": 3}),
    ],
)
def test_same_seed_same_samples(cls, kw):
    sampler = cls(ebmcore.energy("double_well", dim=3), **kw)
    run = lambda seed: sampler.sample(_x0(64, 3, dtype=torch.float32), 20, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))


@pytest.mark.parametrize("name", ["langevin", "mala", "hmc", "nuts", "parallel_tempering", "annealed_langevin"])
def test_registered_samplers_pass_the_core_contract(name):
    from ebmcore.testing import check_sampler

    options = {
        "langevin": {"step_size": 0.05},
        "mala": {"step_size": 0.5},
        "hmc": {"step_size": 0.4},
        "nuts": {"step_size": 0.6},
        "parallel_tempering": {"base_options": {"step_size": 0.5}},
        "annealed_langevin": {"sigmas": [1.0, 0.5], "n_steps_each": 20, "step_size": 0.01},
    }[name]
    # annealed Langevin is not a stationary chain: only the contract, not the moments
    check_sampler(
        lambda energy: ebmcore.registry.get("sampler", name)(energy, **options), check_moments=name != "annealed_langevin"
    )
