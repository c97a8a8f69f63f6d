"""Captured-graph chains (``ebm_samplers.graphs``): on the CPU through a stand-in capture that, like
``torch.cuda.graph``, runs the body once as a warm-up and replays it later (here by running it again); on a GPU (the
last tests, skipped without one) through ``torch.cuda.CUDAGraph``.

What the stand-in checks is the chain's own bookkeeping: the graph's inputs copied in, the warm-up's draws given
back, the remainder of ``n // k``, the counts, the outputs copied out, the cache and its key, and the run's path."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import ebmcore
from ebm_samplers import LangevinSampler, MALASampler, NUTSSampler, graphs
from ebm_samplers.annealed import AnnealedLangevinSampler


class Bowl(ebmcore.EnergyModel):
    """A user module: ``E(x) = ½‖W x‖² + softplus(v·x)``, opaque to ebm."""

    def __init__(self, d: int = 3) -> None:
        super().__init__()
        self.event_shape = (d,)
        self.w = nn.Parameter(torch.eye(d) + 0.1 * torch.ones(d, d))
        self.v = nn.Parameter(torch.linspace(-1.0, 1.0, d))

    def compute_energy(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x @ self.w.T).pow(2).sum(-1) + nn.functional.softplus(x @ self.v)


captures: list[int] = []


def stand_in(body, generator, device):
    """Runs ``body`` once, as ``cuda_capture``'s warm-up does, and replays by running it."""
    captures.append(1)
    body()
    return body


@pytest.fixture
def graphed(monkeypatch):
    """The CPU captures as a GPU would, through :func:`stand_in`."""
    captures.clear()
    monkeypatch.setattr(graphs, "capture_for", lambda device: stand_in)


def per_step(run, n, generator, seed):
    generator.manual_seed(seed)
    s, infos = run.state, []
    for _ in range(n):
        s, info = run.step(s)
        infos.append(info)
    return s, infos


@pytest.mark.parametrize("n", [0, 7, 10, 23])
def test_a_graph_chain_computes_the_per_step_loop_to_the_bit(graphed, n):
    torch.manual_seed(0)
    sampler = LangevinSampler(Bowl(), step_size=0.05, fused=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 3)
    run = sampler.prepare(x, g, {})
    assert run.path.startswith(f"CUDA graph, {graphs.GRAPH_STEPS} transitions per launch (")
    g.manual_seed(5)
    out, info = run.chain(run.state, n, 0, 0)
    expected, _ = per_step(run, n, g, 5)
    assert torch.equal(out.x, expected.x)
    assert info.accepted is None and info.divergent is None


def test_the_warm_up_gives_its_draws_back(graphed):
    """The capture's warm-up draws from the generator; the chain then draws what a fresh per-step loop draws."""
    sampler = MALASampler(Bowl(), step_size=0.3, fused=True)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    run = sampler.prepare(x, g, {})
    out, info = run.chain(run.state, 25, 0, 0)  # no reseeding since prepare
    expected, infos = per_step(run, 25, g, 11)
    assert torch.equal(out.x, expected.x) and torch.equal(out.energy, expected.energy)
    assert torch.equal(info.accepted, sum(i.accepted.int() for i in infos))
    assert torch.equal(info.divergent, sum(i.divergent.int() for i in infos))
    assert 0 < int(info.accepted.sum()) < 25 * 16  # MALA rejects some and accepts some here


def test_outputs_are_copies_and_inputs_are_copied_in(graphed):
    sampler = LangevinSampler(Bowl(), step_size=0.05, fused=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3)
    run = sampler.prepare(x, g, {})
    first, _ = run.chain(run.state, 10, 0, 0)
    kept = first.x.clone()
    second, _ = run.chain(first, 10, 0, 0)
    assert torch.equal(first.x, kept)  # the next call did not write into what the last returned
    assert not torch.equal(second.x, first.x)
    assert torch.equal(x, run.state.x)  # nor into the caller's states


def test_a_sampler_captures_once_and_again_when_what_the_graph_fixes_changes(graphed):
    energy = Bowl()
    sampler = LangevinSampler(energy, step_size=0.05, fused=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3)

    def captured(run_it) -> bool:  # whether preparing this run captured a new graph
        before = len(captures)
        run_it()
        return len(captures) > before

    assert captured(lambda: sampler.prepare(x, g, {}))
    assert not captured(lambda: sampler.prepare(x, g, {}))
    assert not captured(lambda: sampler.prepare(x, torch.Generator().manual_seed(1), {}))  # its state is copied in
    with torch.no_grad():
        energy.w.mul_(1.5)  # in place, as an optimiser updates: the graph reads it at every replay
    assert not captured(lambda: sampler.prepare(x, g, {}))
    for change in (
        lambda: sampler.prepare(x, g, {"step_size": 0.04}),  # a number the graph fixes
        lambda: sampler.prepare(x[:4], g, {}),  # the states' shape
        lambda: sampler.prepare(x, None, {}),
    ):  # the device's generator instead of one given
        assert captured(change)
    energy.w = nn.Parameter(energy.w.detach().clone())  # a new tensor: the old graph would read the old one
    assert captured(lambda: sampler.prepare(x, None, {}))
    energy.eval()  # a module's mode
    assert captured(lambda: sampler.prepare(x, None, {}))
    with ebmcore.use_backend("torch"):  # what the kernels resolve to
        assert captured(lambda: sampler.prepare(x, None, {}))


def test_an_analytic_energys_numbers_are_part_of_the_key(graphed):
    energy = ebmcore.energy("double_well", dim=3)
    sampler = MALASampler(energy, step_size=0.1, fused=True)
    x = torch.randn(6, 3)
    sampler.prepare(x, torch.Generator(), {})
    energy.set_parameters(barrier=3.0)
    run = sampler.prepare(x, torch.Generator().manual_seed(2), {})
    assert len(captures) == 2
    out, _ = run.chain(run.state, 12, 0, 0)
    reference = MALASampler(energy, step_size=0.1, fused=False).prepare(x, torch.Generator().manual_seed(2), {})
    s = reference.state
    for _ in range(12):
        s, _ = reference.step(s)
    assert torch.equal(out.x, s.x)


def test_new_per_chain_params_and_generators_reuse_the_graph_with_their_values(graphed):
    """Per-chain step sizes resolved anew at every run (another tensor each time) and a generator per call (a chunk's):
    copied into the graph's own, so one capture serves them all, and each run computes its per-step loop."""
    energy = Bowl()
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    sampler = MALASampler(energy, step_size=torch.linspace(0.1, 0.3, 6, dtype=torch.float64), fused=True)
    for seed in (1, 2, 3):
        h = torch.linspace(0.1, 0.3, 6, dtype=torch.float64) * seed / 2  # float64 on purpose: .to() makes a new tensor
        out = sampler.sample(x, 13, step_size=h, generator=torch.Generator().manual_seed(seed))
        expected = MALASampler(energy, step_size=h, fused=False).sample(x, 13, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out, expected)
    assert len(captures) == 1


def test_the_generator_given_is_advanced_as_the_per_step_loop_advances_it(graphed):
    energy, x = Bowl(), torch.randn(6, 3)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    LangevinSampler(energy, step_size=0.05, fused=True).sample(x, 23, generator=g1)
    LangevinSampler(energy, step_size=0.05, fused=False).sample(x, 23, generator=g2)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_sample_and_advance_with_a_graph_equal_the_per_step_loop(graphed):
    """The loop every sampler shares runs it (burn-in, thinning, the trajectory, diagnostics), draws no stream key for
    it, and gets the per-step loop's results to the bit."""
    energy = Bowl()
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    results = [
        MALASampler(energy, step_size=0.3, fused=fused).sample(
            x, 32, burn_in=5, thin=4, return_trajectory=True, return_diagnostics=True, generator=torch.Generator().manual_seed(4)
        )
        for fused in (True, False)
    ]
    graph, loop = results
    assert torch.equal(graph.trajectory, loop.trajectory) and graph.trajectory.shape == (8, 8, 3)
    assert torch.equal(graph.diagnostics.acceptance_rate, loop.diagnostics.acceptance_rate)
    assert 0.0 < float(graph.diagnostics.acceptance_rate.mean()) < 1.0
    advanced = [
        LangevinSampler(energy, step_size=0.05, fused=fused).advance(x, 23, generator=torch.Generator().manual_seed(4))
        for fused in (True, False)
    ]
    assert torch.equal(*advanced)


def test_without_fused_true_an_opaque_energy_is_not_captured_and_the_path_says_why(graphed):
    run = LangevinSampler(Bowl(), step_size=0.05).prepare(torch.randn(4, 3), None, {})
    assert run.chain is None and "no CUDA graph: fused=True captures the transitions of an energy ebm does not read" in run.path
    assert not captures


def test_a_declared_program_is_captured_by_default(graphed):
    energy = ebmcore.SequentialEnergy(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)))
    run = MALASampler(energy, step_size=0.1).prepare(torch.randn(4, 3), None, {})
    assert run.path.startswith("CUDA graph, 10 transitions per launch (MALASampler has no fused chain kernels)")


@pytest.mark.parametrize(
    "sampler, reason",
    [
        (NUTSSampler, "its trees stop growing when every chain's has"),
        (AnnealedLangevinSampler, "its state carries n_taken, a Python value a graph would fix"),
    ],
)
def test_samplers_whose_transition_a_graph_cannot_hold_say_why(graphed, sampler, reason):
    with pytest.raises(ebmcore.InputError, match="no fused chain can run: .*no CUDA graph: " + reason):
        sampler(Bowl(), fused=True).prepare(torch.randn(4, 3), None, {})
    assert reason in sampler(Bowl()).prepare(torch.randn(4, 3), None, {}).path and not captures


def failing(body, generator, device):
    captures.append(1)
    body()
    raise RuntimeError("operation not permitted when stream is capturing\nmore")


def test_a_capture_that_fails_falls_back_to_the_per_step_loop_exactly_and_is_not_tried_again(monkeypatch):
    monkeypatch.setattr(graphs, "capture_for", lambda device: failing)
    captures.clear()
    energy = ebmcore.SequentialEnergy(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)))
    x = torch.randn(4, 3)
    sampler = MALASampler(energy, step_size=0.3)
    for _ in range(3):  # the failure is remembered with its key
        run = sampler.prepare(x, torch.Generator().manual_seed(7), {})
    assert len(captures) == 1
    assert run.chain is None
    assert run.path.startswith(
        "per-step loop (MALASampler has no fused chain kernels; no CUDA graph: capturing one "
        "failed: operation not permitted when stream is capturing)"
    )
    reference = MALASampler(energy, step_size=0.3, fused=False).prepare(x, torch.Generator().manual_seed(7), {})
    assert torch.equal(run.step(run.state)[0].x, reference.step(reference.state)[0].x)  # the warm-up's draws given back


def test_with_fused_true_a_capture_that_fails_is_an_error_that_says_why(monkeypatch):
    monkeypatch.setattr(graphs, "capture_for", lambda device: failing)
    with pytest.raises(ebmcore.InputError, match="capturing one failed: operation not permitted"):
        MALASampler(Bowl(), step_size=0.1, fused=True).prepare(torch.randn(4, 3), None, {})


class TorchCudaGraphs:
    """``torch.cuda``'s graph API as PyTorch implements it (``aten/src/ATen/cuda/CUDAGraph.cpp``,
    ``CUDAGeneratorImpl.cpp``), for :func:`graphs.cuda_capture` on the CPU, with the generators' capture mode:
    ``capture_begin`` puts the current device's default generator and every generator registered with the graph in
    capture mode (``capture_prologue``); ``capture_end`` ends the stream's capture and only then, when that succeeds,
    takes them out (``capture_epilogue``); a capture that a host sync invalidated raises there and leaves them in it. A
    draw (:meth:`draw`) checks the mode as ``CUDAGeneratorState::increase`` does."""

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    def __init__(self, default: torch.Generator) -> None:
        self.default, self.in_capture, self.capture_mode, self.current = default, False, set(), None

    def draw(self, generator: torch.Generator | None) -> None:
        mode = (generator or self.default) in self.capture_mode
        if self.in_capture and not mode:
            raise RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode.")
        if not self.in_capture and mode:
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")

    def sync(self) -> None:
        """A host sync: inside a capture (thread_local mode), an error that invalidates it."""
        if self.in_capture:
            self.invalidated = True
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def install(self, monkeypatch) -> None:
        fake = self

        class CUDAGraph:
            def __init__(self) -> None:
                self.registered: list[torch.Generator] = []

            def register_generator_state(self, generator) -> None:
                self.registered.append(generator)

            def replay(self) -> None:
                pass

        @contextlib.contextmanager
        def graph(g, stream=None, capture_error_mode="global"):
            fake.capture_mode |= {fake.default, *g.registered}
            fake.in_capture, fake.invalidated = True, False
            try:
                yield
            finally:
                fake.in_capture = False
                if fake.invalidated:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                fake.capture_mode -= {fake.default, *g.registered}

        for name, value in dict(
            device=lambda d: contextlib.nullcontext(),
            current_stream=TorchCudaGraphs.Stream,
            Stream=TorchCudaGraphs.Stream,
            stream=lambda s: contextlib.nullcontext(),
            set_stream=lambda s: None,
            CUDAGraph=CUDAGraph,
            graph=graph,
        ).items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_a_failed_capture_leaves_the_devices_generator_usable(monkeypatch):
    """On the H100, after an energy's host sync failed a capture, every later run on the device failed with "Offset
    increment outside graph capture encountered unexpectedly": the default generator stayed in capture mode. Through
    the API as PyTorch implements it, a failed capture now leaves it usable, and a later capture works."""
    cuda = TorchCudaGraphs(default=graphs.default_generator(torch.device("cpu")))
    cuda.install(monkeypatch)
    device = torch.device("cpu")

    def syncing() -> None:
        cuda.draw(None)
        cuda.sync()

    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        graphs.cuda_capture(syncing, cuda.default, device)
    cuda.draw(None)  # an eager draw
    replay = graphs.cuda_capture(lambda: cuda.draw(None), cuda.default, device)
    replay()
    own = torch.Generator()
    with pytest.raises(RuntimeError, match="operation not permitted"):  # a chain's own generator, registered
        graphs.cuda_capture(lambda: (cuda.draw(own), cuda.sync()), own, device)
    cuda.draw(None)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("sampler_type", [LangevinSampler, MALASampler])
def test_on_a_gpu_a_captured_graph_computes_the_per_step_loop(sampler_type):
    """The same kernels and the same draws: equal to the per-step loop (to float rounding, should cuBLAS pick another
    algorithm inside the capture), with the same acceptances."""
    torch.manual_seed(0)
    energy = Bowl(5).cuda()
    x = torch.randn(1000, 5, device="cuda")
    run = sampler_type(energy, step_size=0.05, fused=True).prepare(x, None, {})
    assert run.path.startswith("CUDA graph"), run.path
    results = [
        sampler_type(energy, step_size=0.05, fused=fused).sample(
            x, 37, return_diagnostics=True, generator=torch.Generator(device="cuda").manual_seed(3)
        )
        for fused in (True, False)
    ]
    apart = ((results[0].samples - results[1].samples).abs() > 1e-5).any(1)
    # the same kernels: equal, but for a float rounding that flips an accept decision in the odd chain
    assert int(apart.sum()) <= (0 if sampler_type is LangevinSampler else 10), int(apart.sum())
    if sampler_type is MALASampler:
        assert float((results[0].diagnostics.acceptance_rate - results[1].diagnostics.acceptance_rate).abs().max()) <= 0.01


@cuda
def test_on_a_gpu_a_conv_energy_runs_a_captured_graph_by_default():
    from ebm_losses import ConvEnergy

    energy = ConvEnergy(widths=(8, 16), seed=0).cuda()
    x = torch.rand(32, 1, 8, 8, device="cuda") * 2 - 1
    sampler = LangevinSampler(energy, step_size=1.0, noise_scale=0.005)
    assert sampler.prepare(x, None, {}).path.startswith("CUDA graph"), sampler.prepare(x, None, {}).path
    outs = [
        LangevinSampler(energy, step_size=1.0, noise_scale=0.005, fused=fused).sample(
            x, 25, generator=torch.Generator(device="cuda").manual_seed(1)
        )
        for fused in (None, False)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)


@cuda
def test_on_a_gpu_an_energy_that_syncs_is_refused_with_the_reason_and_cuda_is_left_usable():
    class Syncing(Bowl):
        def compute_energy(self, x):
            if float(x.abs().max()) > 1e6:  # a host sync: capture refuses it
                raise AssertionError
            return super().compute_energy(x)

    stream = torch.cuda.current_stream()
    x = torch.randn(64, 3, device="cuda")
    with pytest.raises(ebmcore.InputError, match="no CUDA graph: capturing one failed"):
        MALASampler(Syncing().cuda(), step_size=0.05, fused=True).prepare(x, None, {})
    assert torch.cuda.current_stream() == stream  # left as it was
    sampler = MALASampler(Bowl().cuda(), step_size=0.05, fused=True)  # and a capture after it works
    assert sampler.prepare(x, None, {}).path.startswith("CUDA graph")
    assert sampler.sample(x, 25).isfinite().all()
