"""The object API: trajectory, thinning, diagnostics, safety, precision, errors, plugins."""

import math

import pytest
import torch
from torch import nn

import ebmcore
from ebm_samplers import (
    HMCSampler,
    LangevinSampler,
    MALASampler,
    NUTSSampler,
    NonFiniteChainsWarning,
    SampleResult,
    hmc,
    langevin,
    mala,
)
from ebm_samplers.integrators import EulerMaruyama
from ebmcore.errors import InputError, NonFiniteError

ALL = [
    (LangevinSampler, {"step_size": 0.01}),
    (MALASampler, {"step_size": 0.1}),
    (HMCSampler, {"step_size": 0.1, "n_leapfrog_steps": 3}),
]
IDS = ["langevin", "mala", "hmc"]


def _x0(n=128, d=2, dtype=torch.float32, seed=0):
    return 0.5 * torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("cls, kw", ALL, ids=IDS)
def test_trajectory_holds_the_kept_states_after_burn_in(cls, kw):
    energy = ebmcore.energy("double_well", dim=2)
    sampler = cls(energy, fused=False, **kw)  # the per-step loop (a fused chain draws Philox noise)
    x0 = _x0()
    result = sampler.sample(x0, 12, burn_in=5, thin=3, return_trajectory=True, generator=torch.Generator().manual_seed(1))
    assert isinstance(result, SampleResult) and result.trajectory.shape == (4, 128, 2)
    # the same run step by step
    g = torch.Generator().manual_seed(1)
    state = sampler.init(x0)
    kept = []
    noise = torch.empty_like(x0)
    uniform = torch.empty(128)
    module = {LangevinSampler: langevin, MALASampler: mala, HMCSampler: hmc}[cls]
    bound = {
        LangevinSampler: lambda: (EulerMaruyama().bind(x0),),
        MALASampler: lambda: (EulerMaruyama().bind(x0),),
        HMCSampler: lambda: (sampler.options["integrator"],),
    }[cls]()
    for i in range(17):
        noise.normal_(generator=g)
        if sampler.algorithm.has_acceptance:
            uniform.uniform_(generator=g)
            state, _ = module.transition(state, noise, uniform, sampler.bind(x0), sampler.resolve(x0), *bound)
        else:
            state, _ = module.transition(state, noise, sampler.bind(x0), sampler.resolve(x0), *bound)
        if i >= 5 and (i - 5 + 1) % 3 == 0:
            kept.append(state.x)
    torch.testing.assert_close(result.trajectory, torch.stack(kept))
    assert torch.equal(result.trajectory[-1], result.samples)
    assert not torch.equal(result.trajectory[0], x0)


@pytest.mark.parametrize("cls, kw", ALL, ids=IDS)
def test_diagnostics(cls, kw):
    energy = ebmcore.energy("gaussian", dim=3)
    result = cls(energy, **kw).sample(torch.randn(2000, 3), 50, thin=5, return_diagnostics=True)
    d = result.diagnostics
    assert result.trajectory is None
    assert d.mean.shape == (10, 3) and d.variance.shape == (10, 3) and d.energy.shape == (10,)
    torch.testing.assert_close(d.mean[-1], result.samples.mean(0))
    torch.testing.assert_close(d.energy[-1], energy.energy(result.samples).mean())
    assert d.nonfinite_chains.numel() == 0 and d.wall_time > 0
    if cls is LangevinSampler:
        assert d.acceptance is None and d.divergences is None
    else:
        assert d.acceptance.shape == (10,) and bool(((d.acceptance >= 0) & (d.acceptance <= 1)).all())
        assert d.acceptance_rate.shape == (2000,) and 0.5 < d.acceptance_rate.mean() <= 1
        assert d.divergences.sum() == 0


STATS_CASES = ALL + [(NUTSSampler, {"step_size": 0.3, "max_tree_depth": 4})]


@pytest.mark.parametrize("cls, kw", STATS_CASES, ids=IDS + ["nuts"])
def test_per_draw_stats_are_those_of_the_transition_that_made_each_kept_draw(cls, kw):
    energy = ebmcore.energy("double_well", dim=2)
    infos = []
    result = cls(energy, **kw).sample(
        _x0(64),
        12,
        burn_in=5,
        thin=3,
        return_trajectory=True,
        return_stats=True,
        generator=torch.Generator().manual_seed(2),
        callback=lambda i, s, info: infos.append(info),
    )
    kept = infos[5 + 2 :: 3]  # the transitions after which a draw was kept
    stats = result.stats
    expected = {
        LangevinSampler: {"energy"},
        MALASampler: {"energy", "acceptance", "divergent"},
        HMCSampler: {"energy", "acceptance", "divergent", "hamiltonian"},
        NUTSSampler: {"energy", "acceptance", "divergent", "hamiltonian", "tree_depth", "n_leapfrog_steps"},
    }[cls]
    assert set(stats) == expected and all(v.shape == (4, 64) for v in stats.values())
    torch.testing.assert_close(stats["energy"], energy.energy(result.trajectory.flatten(0, 1)).view(4, 64))
    for name, field in (
        ("acceptance", "acceptance_prob"),
        ("divergent", "divergent"),
        ("hamiltonian", "hamiltonian"),
        ("tree_depth", "tree_depth"),
        ("n_leapfrog_steps", "n_leapfrog_steps"),
    ):
        if name in stats:
            assert torch.equal(stats[name], torch.stack([getattr(info, field) for info in kept]).to(stats[name].dtype))
    if "divergent" in stats:
        assert stats["divergent"].dtype == torch.bool
    if cls is NUTSSampler:
        assert 1 <= int(stats["tree_depth"].min()) and int(stats["tree_depth"].max()) <= 4  # max_tree_depth


def _nan_region_energy():
    class Holey(ebmcore.EnergyModel):
        """A Gaussian with a NaN region x₀ > 1.5."""

        event_shape = (2,)

        def compute_energy(self, x):
            e = 0.5 * (x * x).sum(-1)
            return torch.where(x[:, 0] > 1.5, torch.full_like(e, float("nan")), e)

    return Holey()


@pytest.mark.parametrize("cls, kw", ALL[1:], ids=IDS[1:])
def test_nan_region_and_absurd_steps_are_rejected_and_counted(cls, kw):
    x0 = _x0(500)
    x0[:, 0].clamp_(max=1.0)  # start outside the NaN region
    for energy, kw2 in (
        (_nan_region_energy(), dict(kw, step_size=0.5)),
        (ebmcore.energy("double_well", dim=2), dict(kw, step_size=100.0)),
    ):
        result = cls(energy, **kw2).sample(x0, 40, return_diagnostics=True, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(result.samples).all()
        assert result.diagnostics.divergences.sum() > 0


def test_ula_chains_that_blow_up_are_reported_not_clamped():
    energy = ebmcore.energy("double_well", dim=2)
    x0 = _x0(200)
    x0[[3, 17]] = 8.0  # at h=0.02 a step from |x| > 5 overshoots (4h·x² > 2) and the chain diverges
    with pytest.warns(NonFiniteChainsWarning, match=r"2 of 200 chains became non-finite \(chains \[3, 17\]\)"):
        result = LangevinSampler(energy, step_size=0.02).sample(x0, 30, return_diagnostics=True)
    assert result.diagnostics.nonfinite_chains.tolist() == [3, 17]
    assert not torch.isfinite(result.samples[3]).all()  # left as it is
    assert torch.isfinite(result.samples[2]).all()


@pytest.mark.parametrize("cls, kw", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_chain_state_dtype_is_kept(cls, kw, dtype):
    energy = ebmcore.energy("double_well", dim=2)
    x = cls(energy, **kw).sample(_x0(4000, dtype=dtype), 200, generator=torch.Generator().manual_seed(2))
    assert x.dtype == dtype and torch.isfinite(x).all()
    # E[x²] of the double well is 0.833: even half precision must get close
    assert abs((x.double() ** 2).mean().item() - 0.833) < 0.08


def test_autocast_for_neural_energies_keeps_the_state_dtype():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(32, 32), seed=0)
    params = [p.clone() for p in energy.parameters()]
    x = MALASampler(energy, step_size=0.05, autocast=torch.bfloat16).sample(torch.randn(256, 2), 20)
    assert x.dtype == torch.float32 and torch.isfinite(x).all()
    assert all(torch.equal(p, q) and p.dtype == torch.float32 for p, q in zip(energy.parameters(), params))
    with pytest.raises(InputError, match="autocast must be torch.bfloat16 or torch.float16"):
        MALASampler(energy, autocast=torch.float64)


def test_a_sampler_does_not_own_or_retype_the_model():
    energy = ebmcore.energy("gaussian", dim=2)
    sampler = HMCSampler(energy, step_size=0.1, n_leapfrog_steps=2)
    assert not isinstance(sampler, nn.Module) and not hasattr(sampler, "to")
    sampler.sample(torch.randn(16, 2), 5)
    assert energy.mean.dtype == torch.float32
    with pytest.raises(InputError, match="GaussianEnergy holds torch.float32"):
        sampler.sample(torch.randn(16, 2, dtype=torch.float64), 5)


def test_per_chain_step_sizes():
    energy = ebmcore.energy("double_well", dim=2)
    x0 = _x0(64)
    same = MALASampler(energy, step_size=torch.full((64,), 0.1)).sample(x0, 10, generator=torch.Generator().manual_seed(0))
    scalar = MALASampler(energy, step_size=0.1).sample(x0, 10, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(same, scalar)
    # a chain with a zero-ish step barely moves; the others do
    steps = torch.full((64,), 0.02)
    steps[0] = 1e-12
    x = LangevinSampler(energy, step_size=steps).sample(x0, 10, generator=torch.Generator().manual_seed(0))
    assert (x[0] - x0[0]).abs().max() < 1e-4 and (x[1:] - x0[1:]).abs().max() > 0.1


def test_defaults_follow_the_dimension():
    energy = ebmcore.energy("gaussian", dim=64)
    x = torch.zeros(2, 64)
    assert LangevinSampler(energy).resolve(x).step_size == pytest.approx(0.1 / 4)
    assert MALASampler(energy).resolve(x).step_size == pytest.approx(0.5 / 4)
    t = HMCSampler(energy).resolve(x)
    assert t.step_size == pytest.approx(0.5 / 64**0.25) and t.n_leapfrog_steps == 8


def test_callback_and_progress(capsys):
    seen = []
    LangevinSampler(ebmcore.energy("gaussian", dim=2), step_size=0.1).sample(
        torch.randn(8, 2), 6, burn_in=2, progress=True, callback=lambda i, state, info: seen.append((i, state.x.shape))
    )
    assert [i for i, _ in seen] == list(range(8))
    assert "8/8" in capsys.readouterr().err


@pytest.mark.parametrize(
    "build, call, message",
    [
        (lambda e: LangevinSampler(e, step_size=0.0), {}, "step_size must be a finite positive number"),
        (lambda e: MALASampler(e, step_size=-1), {}, "step_size must be a finite positive number"),
        (lambda e: MALASampler(e, step_size=torch.ones(3)), {}, r"shape \(n_chains,\) = \(8,\)"),
        (lambda e: HMCSampler(e, n_leapfrog_steps=0), {}, "n_leapfrog_steps must be a positive integer"),
        (lambda e: HMCSampler(e, inv_mass=torch.ones(3)), {}, "inv_mass has shape"),
        (lambda e: HMCSampler(e, inv_mass=-torch.ones(2)), {}, "finite and positive"),
        (lambda e: HMCSampler(e, inv_mass=torch.tensor([[1.0, 2.0], [2.0, 1.0]])), {}, "positive definite"),
        (lambda e: MALASampler(e, temperature=0), {}, "temperature must be"),
        (lambda e: MALASampler(e), {"burn_in": -1}, "burn_in must be an integer >= 0"),
        (lambda e: MALASampler(e), {"thin": 0}, "thin must be an integer >= 1"),
        (lambda e: MALASampler(e), {"generator": 3}, "generator must be a torch.Generator"),
    ],
)
def test_bad_parameters_are_clear_errors(build, call, message):
    with pytest.raises(InputError, match=message):  # when the sampler is built, or where x decides, when it runs
        build(ebmcore.energy("gaussian", dim=2)).sample(torch.zeros(8, 2), 3, **call)


def test_unknown_tunable_and_bad_initial_states():
    energy = ebmcore.energy("gaussian", dim=2)
    with pytest.raises(InputError, match="unknown tunable"):
        MALASampler(energy).sample(torch.zeros(8, 2), 3, n_leapfrog_steps=3)
    x0 = torch.zeros(8, 2)
    x0[5, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"initial state x0 .* rows \[5\]"):
        MALASampler(energy).sample(x0, 3)
    with pytest.raises(NonFiniteError, match="energy at the initial state"):
        MALASampler(_nan_region_energy()).sample(torch.full((4, 2), 2.0), 3)


def test_a_third_party_sde_integrator_plugs_in_by_name(ebm_plugins):
    class Halved(EulerMaruyama):
        name = "halved_em"

        def bind(self, like):
            update = super().bind(like)
            return lambda x, grad, noise, h, scale: update(x, grad, noise, h / 2, scale / math.sqrt(2))

    class Plugin:
        @ebmcore.hookimpl
        def ebm_register_integrators(self, registry):
            registry.register_integrator("halved_em", Halved)

    import ebm_samplers.plugin

    ebmcore.register_plugin(ebm_samplers.plugin, "samplers")
    ebmcore.register_plugin(Plugin(), "third_party")
    energy = ebmcore.energy("gaussian", dim=2)
    x0 = torch.randn(16, 2)
    a = LangevinSampler(energy, step_size=0.2, integrator="halved_em").sample(x0, 5, generator=torch.Generator().manual_seed(0))
    b = LangevinSampler(energy, step_size=0.1).sample(x0, 5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a, b)


def test_functional_api_is_plain_and_reproducible():
    energy = ebmcore.energy("gaussian", dim=2)
    fns = energy.bind(torch.zeros(1, 2))
    state = langevin.init(torch.zeros(4, 2), fns)
    step, params = langevin.build_kernel(), langevin.Params(step_size=0.1).resolve(state.x)
    s1, _ = step(state, fns, torch.Generator().manual_seed(0), params)
    s2, _ = step(state, fns, torch.Generator().manual_seed(0), params)
    assert torch.equal(s1.x, s2.x) and torch.equal(state.x, torch.zeros(4, 2))  # the input state is untouched


def test_compiled_langevin_on_a_gaussian_matches_eager():
    """The Gaussian's gradient is a matrix product: inductor once folded x + alpha*(x @ P) into addmm
    and dropped alpha (pytorch/pytorch#167313), so the compiled chain stepped the wrong way."""
    energy = ebmcore.energy("gaussian", mean=torch.zeros(3), covariance=torch.eye(3) * 2)
    x0 = _x0(64, 3)
    compiled = LangevinSampler(energy, step_size=0.1, compile=True, fused=False).sample(
        x0, 5, generator=torch.Generator().manual_seed(1)
    )
    eager = LangevinSampler(energy, step_size=0.1, fused=False).sample(x0, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("energy_name", ["double_well", "gaussian"])
@pytest.mark.parametrize("cls, kw", ALL, ids=IDS)
def test_compiled_transition_matches_eager(cls, kw, energy_name):
    """torch.compile of the transition (random draws outside) gives the eager chains (float64:
    no accept decision flips on rounding)."""
    energy = ebmcore.energy(energy_name, dim=2).to(torch.float64)
    x0 = _x0(256, dtype=torch.float64)
    compiled = cls(energy, compile=True, **kw).sample(x0, 10, generator=torch.Generator().manual_seed(1))
    eager = cls(energy, fused=False, **kw).sample(x0, 10, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-9)


def test_review_regressions():
    """Ambiguous mass shapes, generator devices, returned tensors, and graph-free diagnostics."""
    from ebm_samplers import InverseMass

    energy = ebmcore.energy("gaussian", dim=2)
    dense = torch.tensor([[1.0, 0.5], [0.5, 1.0]])
    with pytest.raises(InputError, match="ambiguous"):
        HMCSampler(energy, inv_mass=dense).sample(torch.zeros(2, 2), 1)
    x = HMCSampler(energy, step_size=0.2, n_leapfrog_steps=2, inv_mass=InverseMass.dense(dense)).sample(torch.zeros(2, 2), 3)
    assert torch.isfinite(x).all()
    with pytest.raises(InputError, match="x0 is on the meta device, which holds shapes but no values"):
        LangevinSampler(ebmcore.energy("double_well")).sample(torch.zeros(2, 2, device="meta"), 1, generator=torch.Generator())
    x0 = torch.zeros(3, 2)
    assert MALASampler(energy).sample(x0, 0) is not x0
    mlp = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    d = LangevinSampler(mlp, step_size=0.01).sample(torch.zeros(8, 2), 3, return_diagnostics=True).diagnostics
    assert not d.energy.requires_grad


def test_hamiltonian_in_info_gives_a_sensible_ebfmi():
    """E-BFMI from the reported H is near 1 on a Gaussian for HMC and NUTS (low values flag trouble)."""
    from ebm_samplers import NUTSSampler

    energy = ebmcore.energy("gaussian", dim=5)
    for sampler in (HMCSampler(energy, step_size=0.3, n_leapfrog_steps=5), NUTSSampler(energy, step_size=0.4)):
        hs = []
        sampler.sample(torch.randn(200, 5), 200, callback=lambda i, s, info: hs.append(info.hamiltonian))
        bfmi = ebmcore.diagnostics.ebfmi(torch.stack(hs)).mean()
        assert 0.6 < float(bfmi) < 2.0, f"{type(sampler).__name__}: E-BFMI {float(bfmi):.2f}"


def test_parallel_tempering_refuses_bases_without_energy_or_temperature():
    from ebm_samplers import ParallelTemperingSampler, warmup

    energy = ebmcore.energy("gaussian", dim=2)
    with pytest.raises(InputError, match="needs a base sampler with a temperature"):
        ParallelTemperingSampler(energy, base="langevin")
    with pytest.raises(InputError, match="no step size to adapt"):
        warmup(ParallelTemperingSampler(energy, "mala"), torch.zeros(4, 2), 10)


@pytest.mark.parametrize("cls, kw", ALL + [(NUTSSampler, {"step_size": 0.3})], ids=IDS + ["nuts"])
def test_no_graph_is_built_through_the_chain_from_an_x0_that_requires_grad(cls, kw):
    x0 = torch.randn(64, 3, requires_grad=True)
    x = cls(ebmcore.energy("gaussian", dim=3), fused=False, **kw).sample(x0, 5)
    assert x.grad_fn is None and not x.requires_grad


def test_langevin_noise_scale_is_a_temperature_and_excludes_one():
    """``noise_scale σ`` apart from the step ``h``: ``x' = x − h∇E + σξ`` is ULA at ``T = σ²/(2h)``; on a unit Gaussian
    its stationary variance is ``σ²/(h(2 − h))``."""
    energy = ebmcore.GaussianEnergy(dim=1, dtype=torch.float64)
    sampler = LangevinSampler(energy, step_size=0.1, noise_scale=0.2)
    assert sampler.resolve(torch.zeros(2, 1, dtype=torch.float64)).temperature == pytest.approx(0.04 / 0.2)
    x = sampler.sample(torch.zeros(4000, 1, dtype=torch.float64), 200, generator=torch.Generator().manual_seed(0))
    assert float(x.var()) == pytest.approx(0.04 / (0.1 * 1.9), rel=0.05)
    with pytest.raises(InputError, match="give temperature or noise_scale, not both"):
        LangevinSampler(energy, step_size=0.1, noise_scale=0.2, temperature=2.0)


def test_a_trajectory_that_cannot_fit_in_memory_is_refused_before_sampling():
    from ebmcore.recording import available_memory

    steps = []
    sampler = MALASampler(ebmcore.energy("gaussian", dim=1000), step_size=0.1)
    with pytest.raises(
        InputError,
        match=r"would keep a \(10000000, 1000, 1000\) trajectory: 40\.0 TB on cpu, which has "
        r".* available\..*thin=.*stream_chunks.*n_samples and chunk_size",
    ):
        sampler.sample(torch.zeros(1000, 1000), 10**7, return_trajectory=True, callback=lambda *args: steps.append(1))
    assert steps == []  # before the first step
    assert 0 < available_memory(torch.device("cpu")) < 4e13 and available_memory(torch.device("meta")) is None
    small = sampler.sample(torch.zeros(10, 1000), 3, return_trajectory=True)  # what fits runs as before
    assert small.trajectory.shape == (3, 10, 1000)


MLP_ENERGY = lambda: ebmcore.MLPEnergy(2, (16, 16), seed=0)  # noqa: E731  # fused on the CPU through its feed-forward plan


@pytest.mark.parametrize("cls, kw", ALL, ids=IDS)
@pytest.mark.parametrize("fused", [None, False], ids=["default", "per-step"])
@pytest.mark.parametrize("make_energy", [lambda: ebmcore.energy("double_well", dim=2), MLP_ENERGY], ids=["analytic", "mlp"])
def test_advance_gives_what_sample_gives_without_its_checks(cls, kw, fused, make_energy):
    sampler = cls(make_energy(), fused=fused, **kw)
    x0 = _x0()
    fused_chain = sampler.prepare(x0, None, {}).chain is not None
    if fused is None and cls is LangevinSampler:  # ebm-cuda's host build runs both energies' ULA chains
        assert fused_chain, sampler.prepare(x0, None, {}).path
    g_sample, g_advance = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    expected = sampler.sample(x0, 7, generator=g_sample)
    got = sampler.advance(x0, 7, generator=g_advance)
    assert torch.equal(got, expected) and torch.equal(g_advance.get_state(), g_sample.get_state())
    still = sampler.advance(x0, 0, generator=g_advance)
    sampler.sample(x0, 0, generator=g_sample)
    assert torch.equal(still, x0) and still.data_ptr() != x0.data_ptr()  # never the caller's own storage
    assert torch.equal(g_advance.get_state(), g_sample.get_state())


def test_advance_checks_its_inputs_and_warns_about_chains_that_blew_up():
    sampler = LangevinSampler(ebmcore.energy("double_well", dim=2), step_size=0.02)
    x0 = _x0()
    with pytest.raises(InputError, match="generator"):
        sampler.advance(x0, 3, generator=7)
    with pytest.raises(InputError, match="shape"):
        sampler.advance(x0[:, :1], 3)
    bad = x0.clone()
    bad[4] = float("nan")
    with pytest.raises(NonFiniteError, match=r"rows \[4\]"):
        sampler.advance(bad, 3)
    x0[5] = 8.0  # diverges, as in test_ula_chains_that_blow_up_are_reported_not_clamped
    with pytest.warns(NonFiniteChainsWarning, match=r"1 of 128 chains became non-finite \(chains \[5\]\)") as caught:
        out = sampler.advance(x0, 30, generator=torch.Generator().manual_seed(0))
    assert caught[0].filename == __file__  # reported at the caller's line
    assert not torch.isfinite(out[5]).all() and torch.isfinite(out[torch.arange(128) != 5]).all()
    mala = MALASampler(ebmcore.energy("double_well", dim=2), step_size=0.1)
    with pytest.raises(NonFiniteError, match="energy at the initial state"):  # where the state carries the energy
        mala.advance(torch.full((4, 2), 1e30), 3)


def test_advance_runs_a_sample_override():
    class Own(LangevinSampler):
        def sample(self, x0, n_steps, **kwargs):
            return torch.zeros_like(x0)

    own = Own(ebmcore.energy("double_well", dim=2), step_size=0.01)
    assert torch.equal(own.advance(_x0(), 3), torch.zeros(128, 2))
    assert own.plan(_x0(), 3).run is None  # a caller that computes with the planned chain must not bypass sample


@pytest.mark.parametrize(
    "cls, kw, fused, declares",
    [
        (LangevinSampler, {"step_size": 0.01}, None, True),
        (LangevinSampler, {"step_size": 0.01}, False, False),
        (MALASampler, {"step_size": 0.1}, None, False),
    ],
    ids=["langevin-fused", "langevin-per-step", "mala"],
)
def test_a_run_declares_the_form_of_its_fused_chain(cls, kw, fused, declares):
    """ULA's fused chain of a feed-forward network declares what it computes (a ``ULAChain``: the energy's program,
    ``h`` and ``σ = √(2hT)``, its backend), so that a loss may run a fused op of the same family itself; the per-step
    loop and MALA declare nothing. The plan of ``advance`` executes that very run."""
    from ebm_samplers.langevin import ULAChain

    energy = MLP_ENERGY()
    sampler = cls(energy, fused=fused, **kw)
    run = sampler.prepare(_x0(), None, {})
    assert sampler.plan(_x0(), 1).run is not None
    if not declares:
        assert not isinstance(run.chain, ULAChain)
        return
    chain = run.chain
    assert isinstance(chain, ULAChain) and chain.backend == "cpu_fused"
    assert (chain.program, chain.step_size, chain.noise_scale) == (energy.program(), 0.01, math.sqrt(2 * 0.01))
