"""Issue 37: what one small call costs besides its arithmetic, counted (never timed): host reads of device values
(syncs on a GPU) and Python function calls per ``sample(x, 1)`` and per ``energy.gradient(x)``, what a run resolves
once and keeps for the next, and that a run too short for a graph replay captures none.

The counts are bounds a change must not exceed; what they were before issue 37 is said beside each. A read is any of
``Tensor.item``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``, ``tolist``, ``numpy``, ``cpu``."""

from __future__ import annotations

import contextlib
import copy
import sys
from typing import Iterator

import pytest
import torch
from torch import nn

import ebmcore
import ebmcore.sampler
from ebm_samplers import LangevinSampler, MALASampler, graphs
from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.errors import InputError, NonFiniteError
from ebmcore.validation import all_finite

READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu")


@contextlib.contextmanager
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The reads of tensor values made inside the block, by name; a fused run's key draw (on the CPU one
    ``torch.randint`` read; on CUDA mixed on the host, no sync: ``tests/test_stream_seed.py``) is left out."""
    reads: list[str] = []
    counting = [True]
    with monkeypatch.context() as m:
        for name in READS:
            original = getattr(torch.Tensor, name)

            def wrapper(self, *args, _original=original, _name=name, **kwargs):
                if counting[0]:
                    reads.append(_name)
                return _original(self, *args, **kwargs)

            m.setattr(torch.Tensor, name, wrapper)
        seed = ebmcore.sampler.stream_seed

        def uncounted_seed(*args, **kwargs):
            counting[0] = False
            try:
                return seed(*args, **kwargs)
            finally:
                counting[0] = True

        m.setattr(ebmcore.sampler, "stream_seed", uncounted_seed)
        yield reads


def python_calls(fn) -> list[str]:
    """The Python functions ``fn()`` calls, in order (``module.qualname``), as ``sys.setprofile`` sees them."""
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            calls.append(f"{frame.f_globals.get('__name__')}.{code.co_qualname}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def gaussian(d: int = 10) -> ebmcore.GaussianEnergy:
    a = torch.randn(d, d, generator=torch.Generator().manual_seed(0))
    return ebmcore.GaussianEnergy(torch.zeros(d), covariance=a @ a.T / d + torch.eye(d))


X = torch.randn(50, 10, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fused", [None, False], ids=["default", "per-step"])
def test_one_small_sample_call_makes_two_reads(monkeypatch, fused):
    """x0's finiteness and the energy's there in one read, the final states' in another (three before)."""
    sampler = LangevinSampler(gaussian(), step_size=0.01, fused=fused)
    g = torch.Generator().manual_seed(2)
    sampler.sample(X, 1, generator=g)  # a first call may resolve and build what the next ones reuse
    with counted_reads(monkeypatch) as reads:
        sampler.sample(X, 1, generator=g)
    assert len(reads) <= 2, reads


def test_a_sampler_whose_state_carries_the_energy_and_gradient_reads_them_with_x0_at_once(monkeypatch):
    sampler = MALASampler(gaussian(), step_size=0.1)
    sampler.sample(X, 1)
    with counted_reads(monkeypatch) as reads:
        sampler.sample(X, 1)
    assert len(reads) <= 2, reads  # x0, E(x0) and ∇E(x0) at once; the final states (four before)
    with counted_reads(monkeypatch) as reads:
        sampler.advance(X, 1)
    assert len(reads) <= 2, reads  # plan (x0, E, ∇E) and the final states (three before)


def test_several_tensors_are_checked_in_one_read(monkeypatch):
    x, e = torch.randn(5, 3), torch.randn(5)
    with counted_reads(monkeypatch) as reads:
        assert all_finite(x, e, None, x.double())
    assert len(reads) == 1
    for bad in (float("nan"), float("inf")):
        e[3] = bad
        assert not all_finite(x, e) and not all_finite(e, x)
    big = torch.full((4,), 3e38)  # finite; its float32 sum overflows: the element-wise test answers
    assert all_finite(big, torch.ones(3)) and all_finite(torch.ones(3), big)
    assert all_finite(torch.arange(3))  # integers are finite


def test_the_gradient_call_goes_straight_to_the_gradient_kernel(monkeypatch):
    """``energy.gradient(x)`` of an energy with a gradient of its own computes that alone (it computed the energy too,
    only to check its shape), with one read (its finiteness) and a bounded number of Python calls (60 before, 25 after)."""
    energy = gaussian(100)
    x = torch.randn(20, 100, generator=torch.Generator().manual_seed(3))
    with ebmcore.use_backend("torch"):
        expected = (x - energy.mean) @ energy.precision
        energy.gradient(x)
        calls = python_calls(lambda: energy.gradient(x))
        with counted_reads(monkeypatch) as reads:
            grad = energy.gradient(x)
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-5)
    assert not any("energy" in c.rsplit(".", 1)[-1] and "gradient" not in c for c in calls), calls
    assert sum(c.endswith("reference_gradient") for c in calls) == 1
    assert len(reads) == 1, reads
    assert len(calls) <= 35, calls


def test_an_autograd_gradient_still_checks_the_energys_shape():
    class Wide(ebmcore.EnergyModel):
        event_shape = (2,)

        def compute_energy(self, x):
            return x * x  # (n, 2): its gradient would be that of the sum

    with pytest.raises(InputError, match=r"returned shape \(4, 2\)"):
        Wide().gradient(torch.randn(4, 2))


def test_a_leaf_energy_with_parameters_of_two_dtypes_is_still_named():
    class Leaf(ebmcore.EnergyModel):
        event_shape = (2,)

        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.ones(2))
            self.b = nn.Parameter(torch.ones(2, dtype=torch.float64))

        def compute_energy(self, x):
            return (x * self.a).sum(-1) + (x.double() * self.b).sum(-1).float()

    with pytest.raises(InputError, match=r"holds parameter 'b' in torch.float64 .* but 'a' is torch.float32"):
        Leaf().gradient(torch.randn(3, 2))
    leaf = Leaf()
    leaf.b = nn.Parameter(torch.ones(2))
    with pytest.raises(InputError, match=r"x has dtype torch.float64 but Leaf holds torch.float32 parameters"):
        leaf.energy(torch.randn(3, 2, dtype=torch.float64))


def test_one_small_sample_call_makes_a_bounded_number_of_python_calls():
    """``sample(x, 1)`` on an analytic energy, in Python calls as ``sys.setprofile`` counts them: by its default path
    (ebm-cuda's fused chain where its host build runs, else the torch backend's: 181 calls before issue 37, 122 after)
    and by the per-step loop under the ``torch`` backend (131 before, 100 after). What it no longer calls per call: the
    energy's kernels, params and chain are resolved at the first call (the per-step transition, built per run, resolves
    its integrator's update kernel once), and the energy's placement is read without walking the module tree."""
    g = torch.Generator().manual_seed(2)
    for fused, backends, most, resolves in ((None, (), 150, 0), (False, ("torch",), 120, 1)):
        sampler = LangevinSampler(gaussian(), step_size=0.01, fused=fused)
        with ebmcore.use_backend(*backends) if backends else contextlib.nullcontext():
            sampler.sample(X, 1, generator=g)
            sampler.sample(X, 1, generator=g)  # the first run keeps nothing (a sampler made for one call), the second does
            calls = python_calls(lambda: sampler.sample(X, 1, generator=g))
        for resolved_once in (
            "analytic.AnalyticEnergy.bind",
            "langevin.build_chain",
            "algorithm.fused_chain",
            "langevin.Params.resolve",
            "module.Module.named_parameters",
            "module.Module.named_modules",
        ):
            assert not any(c.endswith(resolved_once) for c in calls), resolved_once
        assert sum(c.endswith("resolve.resolve_kernel") for c in calls) <= resolves
        assert len(calls) <= most, len(calls)


def test_the_resolution_is_kept_for_states_like_the_last_and_made_again_when_what_it_reads_changes(monkeypatch):
    energy = gaussian()
    sampler = LangevinSampler(energy, step_size=0.01)
    binds: list[int] = []
    bind = AnalyticEnergy.bind
    monkeypatch.setattr(AnalyticEnergy, "bind", lambda self, like: binds.append(1) or bind(self, like))

    def bound(run_it) -> bool:  # whether this run bound the energy anew
        before = len(binds)
        run_it()
        return len(binds) > before

    assert bound(lambda: sampler.sample(X, 1))
    assert bound(lambda: sampler.sample(X, 1))  # the first run keeps nothing: a sampler made for one call pays no key
    assert not bound(lambda: sampler.sample(X, 3))
    assert not bound(lambda: sampler.sample(X + 1.0, 1, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        energy.precision.mul_(1.5)  # in place: the kernels read it at every call
    assert not bound(lambda: sampler.sample(X, 1))
    assert bound(lambda: sampler.sample(X[:7], 1))  # the states' shape
    assert bound(lambda: sampler.sample(X, 1))
    assert bound(lambda: sampler.sample(X, 1, step_size=0.02))  # a tunable: resolved for that run alone
    assert bound(lambda: sampler.sample(X, 1, callback=lambda *a: None))  # every step
    assert bound(lambda: sampler.sample(X, 1))
    energy.set_parameters(mean=torch.ones(10), precision=energy.precision.clone())  # new tensors
    assert bound(lambda: sampler.sample(X, 1))
    energy.backend = "torch"  # the energy's own backend
    assert bound(lambda: sampler.sample(X, 1))
    assert not bound(lambda: sampler.sample(X, 1))
    energy.backend = None
    assert bound(lambda: sampler.sample(X, 1))
    with ebmcore.use_backend("torch"):  # what the kernels resolve to
        assert bound(lambda: sampler.sample(X, 1))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium" if before != "medium" else "high")  # a fused chain's products
        assert bound(lambda: sampler.sample(X, 1))
    finally:
        torch.set_float32_matmul_precision(before)
    sampler.params = type(sampler.params)(step_size=0.05)
    assert bound(lambda: sampler.sample(X, 1))
    assert copy.deepcopy(sampler)._resolution is None  # a copy resolves its own


def test_a_kept_resolution_computes_what_a_fresh_sampler_computes():
    energy = gaussian()
    kept = LangevinSampler(energy, step_size=0.01)
    for seed in range(3):
        x = torch.randn(50, 10, generator=torch.Generator().manual_seed(10 + seed))
        out = kept.sample(x, 4, generator=torch.Generator().manual_seed(seed))
        fresh = LangevinSampler(energy, step_size=0.01).sample(x, 4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out, fresh)
    energy.set_parameters(mean=torch.full((10,), 0.5), precision=energy.precision.clone())
    out = kept.sample(X, 4, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out, LangevinSampler(energy, step_size=0.01).sample(X, 4, generator=torch.Generator().manual_seed(9)))


def test_per_chain_params_are_resolved_at_every_run():
    h = torch.full((50,), 0.01)
    sampler = LangevinSampler(gaussian(), step_size=h, fused=False)
    sampler.sample(X, 1)
    assert sampler._resolution is None


class Raising(ebmcore.EnergyModel):
    """An energy that refuses non-finite inputs itself (as a ``torch.distributions`` log-density with
    ``validate_args`` does)."""

    event_shape = (10,)

    def compute_energy(self, x):
        if not bool(torch.isfinite(x).all()):
            raise ValueError("the energy's own error")
        return 0.5 * x.square().sum(-1)


@pytest.mark.parametrize("sampler_type", [LangevinSampler, MALASampler])
def test_a_non_finite_x0_is_still_what_is_named_first(sampler_type):
    """x0's finiteness is read with the energy's now; a non-finite x0 is named, not what it made fail after."""
    x0 = X.clone()
    x0[3, 2] = float("nan")
    for energy in (gaussian(), Raising()):
        with pytest.raises(NonFiniteError, match=r"initial state x0 is non-finite .* rows \[3\]"):
            sampler_type(energy, step_size=0.01).sample(x0, 2)
        with pytest.raises(NonFiniteError, match=r"initial state x0 is non-finite .* rows \[3\]"):
            sampler_type(energy, step_size=0.01).advance(x0, 2)
    with pytest.raises(NonFiniteError, match=r"initial state x0"):
        LangevinSampler(gaussian(), step_size=0.01).sample(x0, 2, return_trajectory=True)


@pytest.mark.parametrize("fused", [None, True])
def test_a_run_shorter_than_a_replay_captures_no_graph_and_computes_the_per_step_loop(monkeypatch, fused):
    captures: list[int] = []

    def stand_in(body, generator, device):
        captures.append(1)
        body()
        return body

    monkeypatch.setattr(graphs, "capture_for", lambda device: stand_in)
    energy = ebmcore.SequentialEnergy(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)))
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    sampler = MALASampler(energy, step_size=0.3, fused=fused)
    loop = MALASampler(energy, step_size=0.3, fused=False)
    for n in (1, graphs.GRAPH_STEPS - 1):
        out = sampler.sample(x, n, generator=torch.Generator().manual_seed(n))
        assert torch.equal(out, loop.sample(x, n, generator=torch.Generator().manual_seed(n)))
        advanced = sampler.advance(x, n, generator=torch.Generator().manual_seed(n))
        assert torch.equal(advanced, loop.advance(x, n, generator=torch.Generator().manual_seed(n)))
    assert not captures
    path = sampler.prepare(x, None, {}, n_steps=1).path
    assert path.startswith("per-step loop (MALASampler has no fused chain kernels; no CUDA graph for 1 transition(s)")
    out = sampler.sample(x, graphs.GRAPH_STEPS, generator=torch.Generator().manual_seed(5))
    assert captures  # a run of one replay or more captures, as before
    assert torch.equal(out, loop.sample(x, graphs.GRAPH_STEPS, generator=torch.Generator().manual_seed(5)))
