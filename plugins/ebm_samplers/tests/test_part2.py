"""NUTS, adaptation, parallel tempering and annealed Langevin: statistical correctness and their APIs."""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import (
    AnnealedLangevinSampler,
    DualAveraging,
    HMCSampler,
    MALASampler,
    NUTSSampler,
    ParallelTemperingSampler,
    WelfordVariance,
    geometric_sigmas,
    nuts,
    stan_windows,
    warmup,
)
from ebmcore.errors import InputError
from sampler_problems import Banana, correlated_gaussian, double_well_moments

N = 2000


def _x0(n, d, seed=0, dtype=torch.float64, scale=1.0):
    return scale * torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _assert_moments(x, mean, cov, what):
    n = x.shape[0]
    err = ((x.mean(0) - mean).abs() / (cov.diagonal().sqrt() / math.sqrt(n))).max()
    assert err < 5, f"{what}: mean off by {err:.1f} standard errors"
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / n).sqrt()
    err = ((torch.cov(x.T) - cov).abs() / se).max()
    assert err < 5, f"{what}: covariance off by {err:.1f} standard errors"


# --- NUTS --------------------------------------------------------------------------------------


def test_nuts_matches_a_correlated_gaussian_and_reports_its_trajectories():
    energy = correlated_gaussian()
    infos = []
    x = NUTSSampler(energy, step_size=0.3, max_tree_depth=6).sample(
        _x0(N, 10, dtype=torch.float32).double(), 100, burn_in=20, generator=torch.Generator().manual_seed(1), callback=lambda i, s, info: infos.append(info))
    _assert_moments(x, energy.mean, energy.covariance, "NUTS")
    info = infos[-1]
    assert info.tree_depth.shape == (N,) and int(info.tree_depth.max()) <= 6
    assert int(info.n_leapfrog_steps.max()) <= 2**6 - 1 and info.n_leapfrog_computed <= 2**6 - 1
    assert float(info.max_trajectory_length) <= info.n_leapfrog_computed
    assert float(info.mean_trajectory_length) > 3  # it does travel
    assert not bool(info.divergent.any())


def test_nuts_double_well_and_banana():
    dw = ebmcore.energy("double_well", dim=2)
    x = NUTSSampler(dw, step_size=0.25, max_tree_depth=5).sample(_x0(1000, 2, dtype=torch.float32, scale=0.5), 150, burn_in=30,
                                                                generator=torch.Generator().manual_seed(2)).double()
    ref = double_well_moments()
    sd = math.sqrt(ref["x4"] - ref["x2"] ** 2)
    assert abs((x**2).mean().item() - ref["x2"]) < 5 * sd / math.sqrt(x.numel())
    banana = NUTSSampler(Banana().double(), step_size=0.25, max_tree_depth=5).sample(
        _x0(1000, 2), 150, burn_in=50, generator=torch.Generator().manual_seed(3))
    x2 = banana[:, 1]
    assert abs(x2.mean().item() - 1.0) < 5 * x2.std().item() / math.sqrt(1000)


def test_nuts_stops_at_the_depth_cap_and_counts_divergences():
    energy = ebmcore.energy("gaussian", dim=3)
    state = nuts.init(torch.randn(64, 3), energy.bind(torch.zeros(1, 3)))
    step = nuts.build_kernel()
    _, info = step(state, energy.bind(torch.zeros(1, 3)), torch.Generator().manual_seed(0),
                   nuts.Params(step_size=0.01, max_tree_depth=3).resolve(state.x))
    assert int(info.n_leapfrog_steps.max()) == 7 and int(info.tree_depth.max()) == 3  # tiny steps never U-turn
    _, info = step(state, energy.bind(torch.zeros(1, 3)), torch.Generator().manual_seed(0), nuts.Params(step_size=50.0).resolve(state.x))
    assert bool(info.divergent.all())
    x = NUTSSampler(energy, step_size=50.0).sample(torch.randn(64, 3), 5, return_diagnostics=True)
    assert torch.isfinite(x.samples).all() and int(x.diagnostics.divergences.sum()) == 5 * 64


def test_nuts_same_seed_same_samples_and_bad_parameters():
    energy = ebmcore.energy("gaussian", dim=2)
    run = lambda seed: NUTSSampler(energy, step_size=0.3, jitter=0.2).sample(torch.ones(32, 2), 10, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))
    with pytest.raises(InputError, match=r"max_tree_depth must be an integer in \[1, 20\]"):
        NUTSSampler(energy, max_tree_depth=0).sample(torch.ones(4, 2), 1)
    with pytest.raises(InputError, match=r"jitter must be in \[0, 1\)"):
        NUTSSampler(energy, jitter=1.5).sample(torch.ones(4, 2), 1)
    with pytest.raises(InputError, match="does not support compile=True: its trajectories have a data-dependent length"):
        NUTSSampler(energy, compile=True)


# --- adaptation --------------------------------------------------------------------------------


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
    tuned = warmup(sampler, _x0(1000, 10), 300, target_accept=target, generator=g)
    assert abs(tuned.acceptance - target) < 0.05, f"{name}: acceptance {tuned.acceptance:.3f} vs target {target}"
    extra = {"inv_mass": tuned.inv_mass} if tuned.inv_mass is not None else {}
    result = sampler.sample(tuned.x, 100, step_size=tuned.step_size, return_diagnostics=True, generator=g, **extra)
    assert abs(float(result.diagnostics.acceptance_rate.mean()) - target) < 0.05
    _assert_moments(result.samples, energy.mean, energy.covariance, f"adapted {name}")
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


# --- parallel tempering ------------------------------------------------------------------------


def _two_modes():
    return ebmcore.GaussianMixtureEnergy(means=[[-4.0, 0.0], [4.0, 0.0]], stds=0.5)


def test_parallel_tempering_mixes_modes_where_mala_stays():
    energy = _two_modes()
    x0 = torch.tensor([[-4.0, 0.0]]).repeat(N, 1)
    g = torch.Generator().manual_seed(0)
    mala = MALASampler(energy, step_size=0.2).sample(x0, 400, generator=g)
    swaps = []
    pt = ParallelTemperingSampler(energy, "mala", temperatures=[1.0, 3.0, 10.0, 30.0], base_options={"step_size": 0.2})
    result = pt.sample(x0, 400, generator=g, return_diagnostics=True, callback=lambda i, s, info: swaps.append(info.swap_accepted))
    assert float((mala[:, 0] > 0).float().mean()) < 0.01  # MALA never leaves its mode
    right = float((result.samples[:, 0] > 0).float().mean())
    assert abs(right - 0.5) < 5 * math.sqrt(0.25 / N) + 0.02, f"PT occupancy of the right mode {right:.3f}"
    rates = torch.stack(swaps).float().mean((0, 2))
    assert rates.shape == (3,) and bool((rates > 0.2).all())
    assert result.diagnostics.acceptance_rate.shape == (N,) and result.samples.shape == (N, 2)


def test_parallel_tempering_validation():
    energy = _two_modes()
    with pytest.raises(InputError, match="must be ascending, start at 1"):
        ParallelTemperingSampler(energy, temperatures=[2.0, 3.0])
    with pytest.raises(InputError, match="on the same energy"):
        ParallelTemperingSampler(energy, base=MALASampler(ebmcore.energy("gaussian", dim=2)))


# --- annealed Langevin -------------------------------------------------------------------------


class SmoothedMixture(ebmcore.EnergyModel):
    """A noise-conditional energy: the mixture convolved with N(0, σ²I) (exact NCSN target)."""

    noise_conditional = True
    event_shape = (1,)

    def __init__(self, means, std, weights):
        super().__init__()
        self.means, self.std, self.log_w = torch.tensor(means), std, torch.tensor(weights).log()

    def compute_energy(self, x, sigma=None):
        s = torch.tensor(self.std) if sigma is None else torch.sqrt(self.std**2 + sigma[:, None] ** 2)
        z = (x - self.means) / s
        return -torch.logsumexp(self.log_w - 0.5 * z**2 - torch.log(s), dim=1)


def test_annealed_langevin_recovers_mode_weights_that_plain_langevin_cannot():
    energy = SmoothedMixture([-5.0, 5.0], 0.5, [0.2, 0.8])
    x0 = torch.empty(N, 1).uniform_(-8, 8, generator=torch.Generator().manual_seed(0))
    sigmas = geometric_sigmas(10.0, 0.5, 10)
    sampler = AnnealedLangevinSampler(energy, sigmas, n_steps_each=50, step_size=0.02)
    x = sampler.sample(x0, sampler.total_steps, generator=torch.Generator().manual_seed(1))
    right = float((x > 0).float().mean())
    assert abs(right - 0.8) < 0.04, f"annealed: right-mode weight {right:.3f} (true 0.8)"
    from ebm_samplers import LangevinSampler

    plain = LangevinSampler(energy, step_size=0.02).sample(x0, sampler.total_steps, generator=torch.Generator().manual_seed(1))
    assert abs(float((plain > 0).float().mean()) - 0.5) < 0.05  # stuck with the initial split


def test_annealed_langevin_schedule_and_validation():
    assert geometric_sigmas(1.0, 0.01, 3) == pytest.approx([1.0, 0.1, 0.01])
    energy = ebmcore.energy("gaussian", dim=2)
    levels = []
    AnnealedLangevinSampler(energy, [1.0, 0.5], n_steps_each=3).sample(
        torch.zeros(4, 2), 7, callback=lambda i, s, info: levels.append(info.level))
    assert levels == [0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(InputError, match="non-increasing"):
        AnnealedLangevinSampler(energy, [0.1, 1.0])
