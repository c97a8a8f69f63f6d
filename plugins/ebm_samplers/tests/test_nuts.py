"""NUTS: moments of known targets, trajectory reports, the depth cap, divergences, reproducibility, errors."""

import math

import pytest
import torch

import ebmcore
from ebm_samplers import NUTSSampler, nuts
from ebmcore.errors import InputError
from sampler_problems import Banana, correlated_gaussian, double_well_moments, x0_of, assert_moments

N = 2000


def test_nuts_matches_a_correlated_gaussian_and_reports_its_trajectories():
    energy = correlated_gaussian()
    infos = []
    x = NUTSSampler(energy, step_size=0.3, max_tree_depth=6).sample(
        x0_of(N, 10, dtype=torch.float32).double(),
        100,
        burn_in=20,
        generator=torch.Generator().manual_seed(1),
        callback=lambda i, s, info: infos.append(info),
    )
    assert_moments(x, energy.mean, energy.covariance, "NUTS")
    info = infos[-1]
    assert info.tree_depth.shape == (N,) and int(info.tree_depth.max()) <= 6
    assert int(info.n_leapfrog_steps.max()) <= 2**6 - 1 and info.n_leapfrog_computed <= 2**6 - 1
    assert float(info.max_trajectory_length) <= info.n_leapfrog_computed
    assert float(info.mean_trajectory_length) > 3  # it does travel
    assert not bool(info.divergent.any())


def test_nuts_double_well_and_banana():
    dw = ebmcore.energy("double_well", dim=2)
    x = (
        NUTSSampler(dw, step_size=0.25, max_tree_depth=5)
        .sample(x0_of(1000, 2, dtype=torch.float32, scale=0.5), 150, burn_in=30, generator=torch.Generator().manual_seed(2))
        .double()
    )
    ref = double_well_moments()
    sd = math.sqrt(ref["x4"] - ref["x2"] ** 2)
    assert abs((x**2).mean().item() - ref["x2"]) < 5 * sd / math.sqrt(x.numel())
    banana = NUTSSampler(Banana().double(), step_size=0.25, max_tree_depth=5).sample(
        x0_of(1000, 2), 150, burn_in=50, generator=torch.Generator().manual_seed(3)
    )
    x2 = banana[:, 1]
    assert abs(x2.mean().item() - 1.0) < 5 * x2.std().item() / math.sqrt(1000)


def test_nuts_stops_at_the_depth_cap_and_counts_divergences():
    energy = ebmcore.energy("gaussian", dim=3)
    state = nuts.init(torch.randn(64, 3), energy.bind(torch.zeros(1, 3)))
    step = nuts.build_kernel()
    _, info = step(
        state,
        energy.bind(torch.zeros(1, 3)),
        torch.Generator().manual_seed(0),
        nuts.Params(step_size=0.01, max_tree_depth=3).resolve(state.x),
    )
    assert int(info.n_leapfrog_steps.max()) == 7 and int(info.tree_depth.max()) == 3  # tiny steps never U-turn
    _, info = step(
        state, energy.bind(torch.zeros(1, 3)), torch.Generator().manual_seed(0), nuts.Params(step_size=50.0).resolve(state.x)
    )
    assert bool(info.divergent.all())
    x = NUTSSampler(energy, step_size=50.0).sample(torch.randn(64, 3), 5, return_diagnostics=True)
    assert torch.isfinite(x.samples).all() and int(x.diagnostics.divergences.sum()) == 5 * 64


def test_nuts_same_seed_same_samples_and_bad_parameters():
    energy = ebmcore.energy("gaussian", dim=2)
    run = lambda seed: NUTSSampler(energy, step_size=0.3, jitter=0.2).sample(
        torch.ones(32, 2), 10, generator=torch.Generator().manual_seed(seed)
    )  # noqa: E731
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))
    with pytest.raises(InputError, match=r"max_tree_depth must be an integer in \[1, 20\]"):
        NUTSSampler(energy, max_tree_depth=0).sample(torch.ones(4, 2), 1)
    with pytest.raises(InputError, match=r"jitter must be in \[0, 1\)"):
        NUTSSampler(energy, jitter=1.5).sample(torch.ones(4, 2), 1)
    with pytest.raises(InputError, match="does not support compile=True: its trajectories have a data-dependent length"):
        NUTSSampler(energy, compile=True)


def _state_sized_allocations(max_tree_depth: int, inv_mass=None) -> tuple[int, int]:
    """How many tensors of a state's size one NUTS transition allocates outside the energy, and its leaves."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n, d = 32, 64  # a doubling's uniforms, (2^j, n), stay below a state's n·d elements for j < 6
    energy = ebmcore.energy("double_well", dim=d)
    inner = energy.bind(torch.zeros(1, d))
    in_energy = [False]

    def energy_and_gradient(x):
        in_energy[0] = True
        try:
            return inner.energy_and_gradient(x)
        finally:
            in_energy[0] = False

    fns = inner._replace(energy_and_gradient=energy_and_gradient)
    count = [0]

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            given = {a.untyped_storage().data_ptr() for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() >= n * d and t.untyped_storage().data_ptr() not in given:
                    count[0] += not in_energy[0]
            return out

    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0)) * 0.1 + 1.0
    state = nuts.init(x, fns)
    params = nuts.Params(step_size=1e-4, max_tree_depth=max_tree_depth, inv_mass=inv_mass).resolve(x)
    with Allocations():
        _, info = nuts.step(state, fns, torch.Generator().manual_seed(1), params)
    return count[0], info.n_leapfrog_computed


@pytest.mark.parametrize("inv_mass", [None, torch.linspace(0.5, 2.0, 64)])
def test_nuts_leaves_allocate_no_state_sized_temporaries(inv_mass):
    # issue 40: a leaf made ~7 state-sized temporaries (where copies, U-turn sums, vecdot's product); at 10,000 chains
    # × d = 1,000 each is a 40 MB mmap whose pages fault in afresh. Now only the buffers of a transition and one
    # checkpoint pair per doubling are allocated, however many leaves the trees have.
    few, leaves_few = _state_sized_allocations(3, inv_mass)
    many, leaves_many = _state_sized_allocations(6, inv_mass)
    assert (leaves_few, leaves_many) == (7, 63)  # tiny steps never U-turn: the trees reach the cap
    assert many - few == 2 * 3, (few, many)
    assert few <= 28, few
