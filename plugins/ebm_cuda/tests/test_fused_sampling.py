"""The samplers run the fused chains automatically, and sample the right distribution with them."""

import pytest
import torch

import ebmcore
from ebmcore.errors import InputError
from ebmcore.kernels import torch_backend as ref
from ebmcore.kernels.fused import hmc_chain_reference, langevin_chain_reference
from ebm_cuda import reference
from ebm_samplers import HMCSampler, LangevinSampler, NUTSSampler


def _seed_of(generator_seed: int) -> int:
    """The Philox key a fused run draws from torch.Generator().manual_seed(generator_seed)."""
    return int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(generator_seed)))


def _gaussian(d=4):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = a @ a.T / d + torch.eye(d, dtype=torch.float64)
    return ebmcore.energy("gaussian", mean=torch.arange(d, dtype=torch.float64), covariance=cov), cov


def test_langevin_uses_the_fused_chain_by_default():
    energy, _ = _gaussian()
    x0 = torch.randn(50, 4, dtype=torch.float64)
    out = LangevinSampler(energy, step_size=0.05).sample(x0, 12, burn_in=3, generator=torch.Generator().manual_seed(7))
    mean, precision = energy.kernel_args()
    expected = langevin_chain_reference(
        lambda z: ref.gaussian_gradient(z, mean, precision),
        x0,
        n_steps=15,
        step_size=0.05,
        noise_scale=0.1**0.5,
        seed=_seed_of(7),
        offset=0,
        normal=reference.normal,
    )
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_recording_chunks_the_chain_without_changing_it():
    energy, _ = _gaussian()
    x0 = torch.randn(30, 4, dtype=torch.float64)
    sampler = LangevinSampler(energy, step_size=0.05)
    plain = sampler.sample(x0, 20, burn_in=5, generator=torch.Generator().manual_seed(1))
    rec = sampler.sample(
        x0, 20, burn_in=5, thin=3, return_trajectory=True, return_diagnostics=True, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(rec.samples, plain) and rec.trajectory.shape == (6, 30, 4)
    mean, precision = energy.kernel_args()
    after_11 = langevin_chain_reference(
        lambda z: ref.gaussian_gradient(z, mean, precision),
        x0,
        n_steps=11,
        step_size=0.05,
        noise_scale=0.1**0.5,
        seed=_seed_of(1),
        offset=0,
        normal=reference.normal,
    )
    torch.testing.assert_close(rec.trajectory[1], after_11, rtol=1e-6, atol=1e-6)  # kept state 2 = after 5 + 2*3 steps
    torch.testing.assert_close(rec.diagnostics.mean[1], after_11.mean(0), rtol=1e-6, atol=1e-6)


def test_forcing_the_torch_backend_or_fused_false_gives_the_per_step_loop(monkeypatch):
    energy, _ = _gaussian()
    x0 = torch.randn(20, 4, dtype=torch.float64)
    per_step = LangevinSampler(energy, step_size=0.05, fused=False).sample(x0, 10, generator=torch.Generator().manual_seed(3))
    with ebmcore.use_backend("torch"):
        forced = LangevinSampler(energy, step_size=0.05).sample(x0, 10, generator=torch.Generator().manual_seed(3))
    fused = LangevinSampler(energy, step_size=0.05).sample(x0, 10, generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("EBM_BACKEND", "torch")
    by_env = LangevinSampler(energy, step_size=0.05).sample(x0, 10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(forced, per_step) and torch.equal(by_env, per_step)
    assert not torch.equal(fused, per_step)  # a different (Philox) noise stream


def test_fused_true_says_why_it_cannot_run():
    energy, _ = _gaussian()
    x0 = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(InputError, match="callback needs every step"):
        LangevinSampler(energy, fused=True).sample(x0, 3, callback=lambda *a: None)
    with pytest.raises(InputError, match="not an analytic energy"):
        HMCSampler(ebmcore.energy("mlp", dim=4), fused=True).sample(x0.float(), 3)
    with pytest.raises(InputError, match="mass matrix"):
        HMCSampler(energy, inv_mass=torch.full((4,), 2.0, dtype=torch.float64), fused=True).sample(x0, 3)
    with pytest.raises(InputError, match="fused must be"):
        LangevinSampler(energy, fused="yes")


def test_fused_ula_matches_its_exact_stationary_variance():
    # ULA on E = k/2 |x|^2 has stationary variance 1 / (k (1 - h k / 2)) per coordinate.
    k, h, n, d = 2.0, 0.2, 4000, 3
    energy = ebmcore.energy("harmonic", dim=d, stiffness=k)
    out = LangevinSampler(energy, step_size=h).sample(torch.zeros(n, d), 300, generator=torch.Generator().manual_seed(5))
    var = 1.0 / (k * (1 - h * k / 2))
    se = var * (2.0 / (n * d)) ** 0.5  # SE of a variance estimate from n*d independent normals
    assert abs(out.var(0).mean().item() - var) < 5 * se
    assert abs(out.mean().item()) < 5 * (var / (n * d)) ** 0.5


def test_fused_hmc_samples_a_correlated_gaussian_and_reports_acceptance():
    energy, cov = _gaussian(3)
    n = 3000
    sampler = HMCSampler(energy, step_size=0.25, n_leapfrog_steps=6, fused=True)
    res = sampler.sample(
        torch.zeros(n, 3, dtype=torch.float64),
        30,
        burn_in=30,
        return_diagnostics=True,
        generator=torch.Generator().manual_seed(2),
    )
    est = torch.cov(res.samples.T)
    se = (cov.diag()[:, None] * cov.diag()[None, :] + cov**2).sqrt() / n**0.5  # SE of covariance entries
    assert ((est - cov).abs() < 5 * se).all()
    assert ((res.samples.mean(0) - torch.arange(3.0, dtype=torch.float64)).abs() < 5 * (cov.diag() / n).sqrt()).all()
    rate = res.diagnostics.acceptance_rate
    assert rate.shape == (n,) and 0.6 < rate.mean() < 1.0 and res.diagnostics.divergences.sum() == 0


def test_a_fused_kernel_of_negative_priority_runs_only_when_asked():
    from ebmcore import hookimpl
    from ebmcore.kernels import Kernel, KernelBackend
    from ebmcore.testing import isolated_plugins
    from ebm_cuda.backends import HostBackend

    class SlowChains:  # a backend whose chain loses to the per-step loop: priority < 0
        @hookimpl
        def ebm_register_kernels(self, registry):
            chain = HostBackend().kernels["harmonic_langevin_chain"].fn
            registry.register_kernel_backend(
                KernelBackend("slow", [Kernel("harmonic_langevin_chain", chain, ("cpu",), priority=-5)])
            )

    energy = ebmcore.energy("harmonic", dim=3)
    x0 = torch.randn(10, 3)
    with isolated_plugins(SlowChains(), autoload=True, disable=("cuda",)):
        sampler = LangevinSampler(energy, step_size=0.1)
        assert "fused=True forces it" in sampler.prepare(x0, None, {}).path
        auto = sampler.sample(x0, 5, generator=torch.Generator().manual_seed(1))
        sampler.fused = False
        assert torch.equal(auto, sampler.sample(x0, 5, generator=torch.Generator().manual_seed(1)))
        sampler.fused = True
        forced = sampler.sample(x0, 5, generator=torch.Generator().manual_seed(1))
    expected = langevin_chain_reference(
        lambda z: ref.harmonic_gradient(z, torch.zeros(3), 1.0),
        x0,
        n_steps=5,
        step_size=0.1,
        noise_scale=0.2**0.5,
        seed=_seed_of(1),
        offset=0,
        normal=reference.normal,
    )
    torch.testing.assert_close(forced, expected, rtol=1e-6, atol=1e-6)


def test_hmc_uses_the_fused_chain_by_default():
    energy, _ = _gaussian(3)
    x0 = torch.randn(10, 3, dtype=torch.float64)
    out = HMCSampler(energy, step_size=0.2, n_leapfrog_steps=3).sample(x0, 5, generator=torch.Generator().manual_seed(1))
    mean, precision = energy.kernel_args()
    expected, _, _ = hmc_chain_reference(
        lambda z: (ref.gaussian_energy(z, mean, precision), ref.gaussian_gradient(z, mean, precision)),
        x0,
        n_steps=5,
        step_size=0.2,
        n_leapfrog_steps=3,
        inverse_temperature=1.0,
        seed=_seed_of(1),
        offset=0,
        normal=reference.normal,
        uniform=reference.uniform,
    )
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_ula_on_a_neural_energy_can_draw_its_noise_in_the_step_kernel():
    class GeluEnergy(ebmcore.EnergyModel):  # GELU: no network chain kernel, so the per-step loop
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))

        def compute_energy(self, x):
            return self.net(x).squeeze(-1)

    torch.manual_seed(0)
    energy = GeluEnergy()
    x0 = torch.randn(64, 2)
    sampler = LangevinSampler(energy, step_size=0.01)
    assert "langevin_step_philox" in sampler.prepare(x0, None, {}).path  # CPU: not automatic
    sampler.fused = True  # forced: one langevin_step_philox per step
    out = sampler.sample(x0, 4, generator=torch.Generator().manual_seed(2))
    x = x0
    for t in range(4):
        x = x - 0.01 * energy.gradient(x) + 0.02**0.5 * reference.normal(64, 2, _seed_of(2), t)
    torch.testing.assert_close(out, x, rtol=1e-5, atol=1e-5)


def test_per_step_sampling_of_image_shaped_states_with_the_step_kernels():
    class Quadratic(ebmcore.EnergyModel):
        event_shape = (2, 3)

        def compute_energy(self, x):
            return 0.5 * (x * x).flatten(1).sum(1)

    x0 = torch.randn(16, 2, 3)
    with ebmcore.use_backend("cpu_fused", "torch"):  # what the cuda backend is on a GPU: the step kernel first
        got = LangevinSampler(Quadratic(), step_size=0.1, fused=False).sample(x0, 4, generator=torch.Generator().manual_seed(0))
    with ebmcore.use_backend("torch"):
        expected = LangevinSampler(Quadratic(), step_size=0.1, fused=False).sample(
            x0, 4, generator=torch.Generator().manual_seed(0)
        )
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda e: LangevinSampler(e, step_size=0.01),
        lambda e: HMCSampler(e, step_size=0.2, n_leapfrog_steps=5),
        lambda e: NUTSSampler(e, step_size=0.3),
    ],
    ids=["langevin", "hmc", "nuts"],
)
def test_checkpointed_segments_of_a_fused_run_equal_one_run(tmp_path, make):
    from ebmcore.chunks import load_checkpoint, sample_in_segments

    energy = ebmcore.energy("double_well", dim=2)
    x0 = torch.randn(200, 2, generator=torch.Generator().manual_seed(0))
    one = make(energy).sample(
        x0, 300, burn_in=50, thin=2, return_trajectory=True, return_stats=True, generator=torch.Generator().manual_seed(7)
    )
    cut = sample_in_segments(
        make(energy),
        x0,
        300,
        40,
        tmp_path / "a",
        burn_in=50,
        thin=2,
        generator=torch.Generator().manual_seed(7),
        on_segment=lambda i: None,
    )
    assert torch.equal(cut.samples, one.samples) and torch.equal(cut.trajectory, one.trajectory)
    assert cut.stats.keys() == one.stats.keys() and all(torch.equal(cut.stats[k], v) for k, v in one.stats.items())
    if isinstance(make(energy), HMCSampler):  # a fused call per kept draw reports its 2 transitions: 0, 1/2 or 1 accepted
        assert set(one.stats["acceptance"].unique().tolist()) <= {0.0, 0.5, 1.0}
        assert one.stats["divergent"].dtype == torch.bool

    def stop_after_two(index):
        if index == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sample_in_segments(
            make(energy),
            x0,
            300,
            40,
            tmp_path / "b",
            burn_in=50,
            thin=2,
            generator=torch.Generator().manual_seed(7),
            on_segment=stop_after_two,
        )
    resumed = sample_in_segments(
        make(energy),
        x0,
        300,
        40,
        tmp_path / "b",
        burn_in=50,
        thin=2,
        generator=torch.Generator(),
        saved=load_checkpoint(tmp_path / "b", torch.device("cpu")),
    )
    assert torch.equal(resumed.samples, one.samples) and torch.equal(resumed.trajectory, one.trajectory)
    assert all(torch.equal(resumed.stats[k], v) for k, v in one.stats.items())


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda e: LangevinSampler(e, step_size=0.01), "gaussian_langevin_chain"),
        (lambda e: HMCSampler(e, step_size=0.1, n_leapfrog_steps=3), "gaussian_hmc_chain"),
        (lambda e: NUTSSampler(e, step_size=0.3), "gaussian_nuts_chain"),
    ],
    ids=["langevin", "hmc", "nuts"],
)
def test_a_fused_chain_steps_aside_where_it_was_measured_to_stop_paying(make, op):
    """Issue 29: NUTS on a 1,000-d Gaussian took the fused chain by default and was 12× slower. The host chains of
    the Gaussian (a d² gradient per chain) declare where they stop beating the per-step loop; the automatic choice
    keeps to it and says why, fused=True still forces the chain, and an energy with a d-cost gradient keeps it."""
    from ebm_cuda.backends import HOST_CHAINS_PAY_UP_TO

    limit = HOST_CHAINS_PAY_UP_TO[op]

    def path(d, energy=None, **kw):
        energy = energy or ebmcore.GaussianEnergy(torch.zeros(d), covariance=torch.eye(d))
        sampler = make(energy)
        for k, v in kw.items():
            setattr(sampler, k, v)
        return sampler.prepare(torch.randn(4, d), None, {}).path

    assert path(limit) == "fused chain"
    assert path(limit + 1).startswith(
        f"per-step loop (the {op} kernel is slower than the per-step loop beyond {limit} "
        f"elements per chain (measured), got {limit + 1}; fused=True forces it"
    )
    assert path(limit + 1, fused=True) == "fused chain"
    assert path(4 * limit, ebmcore.energy("double_well", dim=4 * limit)) == "fused chain"


def test_fused_network_chains_return_states_that_do_not_require_grad():
    """The ops have no autograd formula: a network's weights (parameters) among their inputs must not make the returned
    states require grad (found in review: ``sample()`` of an MLPEnergy returned a tensor ``.numpy()`` refused)."""
    import ebmcore
    from ebm_samplers import LangevinSampler
    from ebm_samplers.langevin import ULAChain

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    sampler = LangevinSampler(energy, step_size=0.01)
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    assert isinstance(sampler.prepare(x, None, {}).chain, ULAChain)  # the fused network chain runs here (cpu_fused)
    out = sampler.sample(x, 3, generator=torch.Generator().manual_seed(1))
    assert not out.requires_grad and out.grad_fn is None
    out.numpy()
