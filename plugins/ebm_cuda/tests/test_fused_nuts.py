"""The fused NUTS chain (host build): the right distribution, the torch NUTS's trajectory statistics, the
depth cap, divergences, seeded reproducibility, resuming, and the settings it refuses."""

import pytest
import torch

import ebmcore
from ebmcore.errors import InputError
from ebmcore.sampler import NoiseStream
from ebm_cuda.backends import HostBackend
from ebm_samplers import NUTSSampler

KERNEL = HostBackend().kernels["harmonic_nuts_chain"].fn


def _correlated(d):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = a @ a.T / d + torch.eye(d, dtype=torch.float64)
    return ebmcore.energy("gaussian", mean=torch.linspace(-1.0, 1.0, d, dtype=torch.float64), covariance=cov), cov


def _fused_run(sampler, x0, n_steps, seed):
    """``n_steps`` iterations in one fused call: the final state and the per-chain sums it reports."""
    run = sampler.prepare(x0, None, {})
    assert run.path == "fused chain"
    state, info = run.chain(run.state, n_steps, seed, 0)
    return state.x, info


def test_fused_nuts_samples_a_20d_standard_gaussian():
    # 2,000 independent chains, each started from a draw of the target: the final states are 2,000 exact draws
    # (NUTS keeps the target), so each coordinate's mean has SE 1/sqrt(n) and its variance SE sqrt(2/n).
    n, d = 2000, 20
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    sampler = NUTSSampler(ebmcore.energy("harmonic", dim=d), step_size=0.5)
    x = sampler.sample(x0, 50, generator=torch.Generator().manual_seed(1)).double()
    assert (x.mean(0).abs() < 5 / n**0.5).all()
    assert ((x.var(0) - 1).abs() < 5 * (2 / n) ** 0.5).all()
    assert (x - x0.double()).abs().mean() > 0.5  # it moved


@pytest.mark.parametrize("d", [2, 10])
def test_fused_nuts_samples_a_correlated_gaussian_from_a_cold_start(d):
    energy, cov = _correlated(d)
    n = 2000
    x = NUTSSampler(energy, step_size=0.3, fused=True).sample(
        torch.zeros(n, d, dtype=torch.float64), 40, burn_in=20, generator=torch.Generator().manual_seed(2)
    )
    se_cov = (cov.diag()[:, None] * cov.diag()[None, :] + cov**2).sqrt() / n**0.5  # SE of covariance entries
    assert ((torch.cov(x.T) - cov).abs() < 5 * se_cov).all()
    assert ((x.mean(0) - energy.mean).abs() < 5 * (cov.diag() / n).sqrt()).all()


def test_fused_and_torch_nuts_build_trajectories_alike():
    # The same algorithm on different random streams: per chain, the mean acceptance statistic, tree depth and
    # leapfrog count over 10 iterations from a draw of the target agree within Monte Carlo error (chains independent).
    energy, cov = _correlated(4)
    n, k = 400, 10
    x0 = (
        energy.mean
        + torch.randn(n, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    )
    _, info = _fused_run(NUTSSampler(energy, step_size=0.4, max_tree_depth=6), x0, k, seed=11)
    infos = []
    NUTSSampler(energy, step_size=0.4, max_tree_depth=6, fused=False).sample(
        x0, k, generator=torch.Generator().manual_seed(4), callback=lambda i, s, inf: infos.append(inf)
    )
    torch_stats = {
        "accepted": torch.stack([i.acceptance_prob for i in infos]).mean(0),
        "tree_depth": torch.stack([i.tree_depth for i in infos]).double().mean(0),
        "n_leapfrog_steps": torch.stack([i.n_leapfrog_steps for i in infos]).double().mean(0),
    }
    for name, theirs in torch_stats.items():
        ours = getattr(info, name).double() / k
        se = (ours.var() / n + theirs.var() / n) ** 0.5
        assert abs(ours.mean() - theirs.mean()) < 5 * se, (name, ours.mean(), theirs.mean(), se)
    assert 1.5 < float(info.tree_depth.double().mean()) / k < 5  # the trees do vary: the comparison has power
    assert int(info.divergent.sum()) == 0


def test_the_depth_cap_bounds_every_tree():
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    center = torch.zeros(3)
    for depth, leaves in ((1, 1), (3, 7)):  # tiny steps never U-turn: every tree is full, 2^depth - 1 leaves
        out, acc, div, n_leapfrog, tree_depth = KERNEL(
            x, center, 1.0, n_steps=4, step_size=1e-3, max_tree_depth=depth, inverse_temperature=1.0, seed=5, offset=0
        )
        assert (n_leapfrog == 4 * leaves).all() and (tree_depth == 4 * depth).all() and (div == 0).all()
        assert ((acc / 4 - 1).abs() < 1e-3).all()  # energy kept to O(h^2): the statistic is ~1
    with pytest.raises(InputError, match=r"max_tree_depth must be in \[1, 20\]"):
        KERNEL(x, center, 1.0, n_steps=1, step_size=0.1, max_tree_depth=21, inverse_temperature=1.0, seed=5, offset=0)


def test_divergences_are_counted_and_non_finite_energies_never_chosen():
    x0 = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    res = NUTSSampler(ebmcore.energy("gaussian", dim=3), step_size=50.0).sample(
        x0, 5, return_diagnostics=True, generator=torch.Generator().manual_seed(1)
    )
    assert torch.isfinite(res.samples).all() and int(res.diagnostics.divergences.sum()) == 5 * 64
    # a step this size overflows float32: every leaf's energy is inf, weight 0, divergent; the chain stays put
    out, acc, div, n_leapfrog, depth = KERNEL(
        x0, torch.zeros(3), 1.0, n_steps=3, step_size=1e30, max_tree_depth=10, inverse_temperature=1.0, seed=2, offset=0
    )
    assert torch.equal(out, x0) and (div == 3).all() and (acc == 0).all() and (n_leapfrog == 3).all() and (depth == 0).all()


def test_per_chain_step_sizes_and_temperature():
    x0 = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    kw = dict(n_steps=5, max_tree_depth=10, seed=3, offset=0)
    scalar = KERNEL(x0, torch.zeros(3), 1.0, step_size=0.3, inverse_temperature=0.5, **kw)
    vector = KERNEL(x0, torch.zeros(3), 1.0, step_size=torch.full((40,), 0.3), inverse_temperature=0.5, **kw)
    assert all(torch.equal(a, b) for a, b in zip(scalar, vector))
    n = 2000  # at temperature 2 the harmonic well's variance is 2
    x = NUTSSampler(ebmcore.energy("harmonic", dim=3), step_size=0.4, temperature=2.0, fused=True).sample(
        2**0.5 * torch.randn(n, 3, generator=torch.Generator().manual_seed(1)), 30, generator=torch.Generator().manual_seed(2)
    )
    assert ((x.var(0) - 2).abs() < 5 * 2 * (2 / n) ** 0.5).all()


def test_same_seed_same_draws_and_a_shared_stream_resumes_the_run():
    energy = ebmcore.energy("double_well", dim=2)
    x0 = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    sampler = NUTSSampler(energy, step_size=0.3)
    run = lambda seed: sampler.sample(x0, 20, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(run(7), run(7)) and not torch.equal(run(7), run(8))
    one = sampler.sample(x0, 20, burn_in=4, thin=3, return_trajectory=True, generator=torch.Generator().manual_seed(7))
    assert torch.equal(one.samples, sampler.sample(x0, 20, burn_in=4, generator=torch.Generator().manual_seed(7)))
    stream = NoiseStream()
    first = sampler.sample(x0, 10, burn_in=4, generator=torch.Generator().manual_seed(7), stream=stream)
    second = sampler.sample(first, 10, stream=stream)
    assert stream.offset == 24 and torch.equal(second, one.samples)


def test_fused_true_says_why_the_nuts_chain_cannot_run():
    energy = ebmcore.energy("harmonic", dim=3)
    x0 = torch.randn(5, 3)
    with pytest.raises(InputError, match="a mass matrix is set, the fused chain uses the identity"):
        NUTSSampler(energy, inv_mass=torch.full((3,), 2.0), fused=True).sample(x0, 2)
    with pytest.raises(InputError, match="per-chain temperatures are set"):
        NUTSSampler(energy, temperature=torch.ones(5), fused=True).sample(x0, 2)
    with pytest.raises(InputError, match="jitter=0.1 is set"):
        NUTSSampler(energy, jitter=0.1, fused=True).sample(x0, 2)
    with pytest.raises(InputError, match="not an analytic energy"):
        NUTSSampler(ebmcore.energy("mlp", dim=3), fused=True).sample(x0, 2)
    assert (
        NUTSSampler(energy, inv_mass=torch.full((3,), 2.0)).prepare(x0, None, {}).path
        == "per-step loop (a mass matrix is set, the fused chain uses the identity)"
    )


def test_per_draw_stats_of_a_thinned_fused_run_are_the_means_over_the_transitions_between_draws():
    energy = ebmcore.energy("double_well", dim=2)
    x0 = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
    sampler = NUTSSampler(energy, step_size=0.3, max_tree_depth=5)
    run = lambda thin: sampler.sample(
        x0,
        12,
        burn_in=3,
        thin=thin,
        return_trajectory=True,
        return_stats=True,  # noqa: E731
        generator=torch.Generator().manual_seed(5),
    )
    every, thinned = run(1), run(3)  # one noise stream: the kept draws of thin=3 are every third of thin=1's
    assert sampler.prepare(x0, None, {}).path == "fused chain" and torch.equal(thinned.trajectory, every.trajectory[2::3])
    assert set(every.stats) == {"energy", "acceptance", "divergent", "tree_depth", "n_leapfrog_steps"}  # no Hamiltonian
    assert every.stats["tree_depth"].dtype == torch.int64 and int(every.stats["tree_depth"].max()) <= 5
    groups = lambda name: every.stats[name].view(4, 3, 50).double()  # noqa: E731
    for name in ("acceptance", "tree_depth", "n_leapfrog_steps"):
        torch.testing.assert_close(thinned.stats[name].double(), groups(name).mean(1))
    assert torch.equal(thinned.stats["divergent"], every.stats["divergent"].view(4, 3, 50).any(1))
    torch.testing.assert_close(thinned.stats["energy"], every.stats["energy"][2::3])


def test_a_fused_run_keeps_positions_only_and_diagnostics_evaluate_the_energy_there():
    """The fused NUTS run does not recompute energies and gradients after each call (nuts.FusedState); the energy the
    diagnostics record is evaluated at the kept states, as the per-step loop's state carries it."""
    from ebm_samplers.nuts import FusedState

    energy = ebmcore.energy("harmonic", dim=4)
    x0 = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    sampler = NUTSSampler(energy, step_size=0.5)
    run = sampler.prepare(x0, torch.Generator().manual_seed(1), {})
    state, _ = run.chain(run.state, 3, 7, 0)
    assert type(state) is FusedState and run.energy_of(state).shape == (50,)
    result = sampler.sample(x0, 6, return_trajectory=True, return_diagnostics=True, generator=torch.Generator().manual_seed(1))
    expected = torch.stack([energy.energy(x).mean() for x in result.trajectory])
    torch.testing.assert_close(result.diagnostics.energy.to(expected.dtype), expected)
