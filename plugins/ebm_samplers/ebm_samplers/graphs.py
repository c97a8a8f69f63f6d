"""``GRAPH_STEPS`` transitions per launch of a captured CUDA graph: the chain of any algorithm on CUDA whose transition
makes no host sync, for energies no fused chain kernel runs (conv networks, user modules).

A :class:`GraphChain` captures ``k`` calls of a run's ``step(state) -> (state, info)`` (the per-step loop's own
transition, its random draws included) into one CUDA graph and replays it. It computes what the per-step loop computes
from the same generator state, to the bit: the graph holds the same kernels, and PyTorch's captured random draws take
the offsets eager draws would take. The ``seed``/``offset`` of the :data:`~ebmcore.sampler.Chain` call are not used:
the noise is the generator's, as in the per-step loop. What a graph fixes at capture: the tensors' addresses (the
energy's parameters are read at every replay, so in-place updates by an optimiser are seen), every Python value
(step sizes, branches of ``compute_energy``) and the kernels resolved. :func:`graph_key` names what a captured graph
depends on, and a sampler captures again when it changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore import EnergyModel
from ebmcore.energies.program import Program
from ebm_samplers.algorithm import ChainInfo

__all__ = ["GRAPH_STEPS", "Capture", "GraphChain", "capture_for", "cuda_capture", "generator_of", "graph_key",
           "state_refusal"]

GRAPH_STEPS = 10
"""Transitions per graph replay: a chain call of ``n`` transitions replays the graph ``n // GRAPH_STEPS`` times and runs
the rest one by one. Capture time and graph memory grow with it; the launches it saves, per step, do not."""

Capture = Callable[[Callable[[], None], torch.Generator], Callable[[], None]]
"""``capture(body, generator) -> replay``: records ``body()``'s kernels (drawing from ``generator``) and returns ``replay()``, which runs them. It may run ``body`` before (a warm-up); the caller restores the
generator and overwrites what ``body`` writes."""


def cuda_capture(body: Callable[[], None], generator: torch.Generator) -> Callable[[], None]:
    """:data:`Capture` by ``torch.cuda.CUDAGraph``: runs ``body`` once on a side stream (lazy initialisation, such as
    cuBLAS handles, autotuning and the step's buffers, must not happen inside a capture), then captures it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not torch.cuda.default_generators[generator.device.index or 0]:  # the default one is registered
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def capture_for(device: torch.device) -> Capture | None:
    """How to capture a graph on ``device`` (None: it has no graphs)."""
    return cuda_capture if device.type == "cuda" else None


def generator_of(generator: Optional[torch.Generator], device: torch.device) -> torch.Generator:
    """The generator a step on ``device`` draws from: ``generator``, or the device's default."""
    if generator is not None:
        return generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def state_refusal(state: Any) -> Optional[str]:
    """Why a graph cannot hold ``state`` (a dataclass of tensors), or None."""
    if not dataclasses.is_dataclass(state):
        return f"its state is a {type(state).__name__}, not a dataclass of tensors"
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if value is not None and not isinstance(value, Tensor):
            return f"its state carries {field.name}, a Python value a graph would fix at capture"
    return None


def graph_key(energy: EnergyModel, program: Program, x: Tensor, params: Any, generator: Optional[torch.Generator],
              path: str) -> tuple:
    """What a captured graph depends on besides the tensors' values: the states' shape, dtype and device; the params'
    numbers and their tensors' addresses; the generator; the energy's ``program``, parameters and buffers (addresses,
    shapes, dtypes) and every module's mode; and ``path``, what the energy's kernels resolved to."""
    def identity(t: Tensor) -> tuple:
        return (t.data_ptr(), t.shape, t.dtype, t.device)

    fields = tuple((f.name, identity(v) if isinstance(v, Tensor) else v)
                   for f in dataclasses.fields(params) for v in (getattr(params, f.name),))
    tensors = tuple((name, identity(t)) for name, t in (*energy.named_parameters(), *energy.named_buffers()))
    modes = tuple(m.training for m in energy.modules())
    return (x.shape, x.dtype, x.device, fields, generator, program, tensors, modes, path)


class GraphChain:
    """A :data:`~ebmcore.sampler.Chain` that runs ``step`` ``k`` times per replay of a graph ``capture`` made of it.

    ``step(state) -> (state, info)``: one transition with everything bound (``Run.step``), whose info carries per-chain
    ``accepted`` and ``divergent`` where ``counts`` (summed per call into :class:`ChainInfo`). The graph's inputs are
    copies of ``state``'s tensors, made at construction; the capture runs there too. Each call copies its state in,
    replays, runs the remainder eagerly and returns copies (a graph's outputs are overwritten by its next replay)."""

    def __init__(self, step: Callable[[Any], tuple[Any, Any]], state: Any, counts: bool, generator: torch.Generator,
                 capture: Capture, k: int = GRAPH_STEPS) -> None:
        self.step, self.k = step, k
        self.names = [f.name for f in dataclasses.fields(state) if getattr(state, f.name) is not None]
        self.static = dataclasses.replace(state, **{name: getattr(state, name).clone() for name in self.names})
        n = state.x.shape[0]
        self.accepted = torch.zeros(n, dtype=torch.int32, device=state.x.device) if counts else None
        self.divergent = torch.zeros(n, dtype=torch.int32, device=state.x.device) if counts else None
        rng = generator.get_state()
        try:
            self.replay = capture(self._body, generator)
        finally:  # a warm-up's draws are given back: the chain draws what the per-step loop would
            generator.set_state(rng)

    def _body(self) -> None:
        """What the graph holds: ``k`` counted transitions from the static state, written back there."""
        s = self._steps(self.static, self.k)
        for name in self.names:
            getattr(self.static, name).copy_(getattr(s, name))

    def _steps(self, s: Any, k: int) -> Any:
        """``k`` transitions from ``s``, their acceptances and divergences counted."""
        for _ in range(k):
            s, info = self.step(s)
            if self.accepted is not None:
                self.accepted.add_(info.accepted)
                self.divergent.add_(info.divergent)
        return s

    def __call__(self, state: Any, n: int, seed: int, offset: int) -> tuple[Any, ChainInfo]:
        for name in self.names:
            getattr(self.static, name).copy_(getattr(state, name))
        if self.accepted is not None:
            self.accepted.zero_()
            self.divergent.zero_()
        for _ in range(n // self.k):
            self.replay()
        s = self._steps(self.static, n % self.k)
        out = dataclasses.replace(s, **{name: getattr(s, name).clone() for name in self.names})
        if self.accepted is None:
            return out, ChainInfo(None, None)
        return out, ChainInfo(self.accepted.clone(), self.divergent.clone())
