"""``GRAPH_STEPS`` transitions per launch of a captured CUDA graph: the chain of any algorithm on CUDA whose transition
makes no host sync, for energies no fused chain kernel runs (conv networks, user modules).

A :class:`GraphChain` captures ``k`` calls of a run's transition (the per-step loop's own, its random draws included)
into one CUDA graph and replays it. It computes what the per-step loop computes from the same generator state: the
graph holds the same kernels, and PyTorch's captured random draws take the offsets eager draws would take. The
``seed``/``offset`` of the :data:`~ebmcore.sampler.Chain` call are not used: the noise is the generator's, as in the
per-step loop.

What a graph fixes at capture, and how a sampler keeps it right (:func:`graph_key`): the addresses of the energy's
parameters and buffers (read at every replay, so an optimiser's in-place updates are seen; a new tensor, or a new
number in an analytic energy, captures again), every Python value the transition reads (the params' numbers, the
program, module modes, the kernels resolved, autocast). The params' tensors (per-chain step sizes, a mass matrix) and
the generator's state are copied into the graph's own at every call, so new ones of the same shape reuse it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore import EnergyModel
from ebmcore.energies.program import Analytic, Program
from ebmcore.kernels.resolve import selection
from ebmcore.sampler import default_generator
from ebm_samplers.algorithm import ChainInfo

__all__ = [
    "GRAPH_STEPS",
    "Capture",
    "GraphChain",
    "capture_for",
    "cuda_capture",
    "graph_key",
    "has_tensors",
    "kept_tensors",
    "state_refusal",
]

GRAPH_STEPS = 10
"""Transitions per graph replay: a chain call of ``n`` transitions replays the graph ``n // GRAPH_STEPS`` times and runs
the rest one by one. Capture time and graph memory grow with it; the launches it saves, per step, do not."""

Capture = Callable[[Callable[[], None], torch.Generator, torch.device], Callable[[], None]]
"""``capture(body, generator, device) -> replay``: records ``body()``'s kernels on ``device`` (drawing from
``generator``) and returns ``replay()``, which runs them. It may run ``body`` before (a warm-up); the caller restores
the generator and overwrites what ``body`` writes. It raises if ``body`` cannot be captured."""


def cuda_capture(body: Callable[[], None], generator: torch.Generator, device: torch.device) -> Callable[[], None]:
    """:data:`Capture` by ``torch.cuda.CUDAGraph``, on ``device``: runs ``body`` once on a side stream (lazy
    initialisation, such as cuBLAS handles, autotuning and the step's buffers, must not happen inside a capture), then
    captures it on a stream of its own. A capture that fails raises ``body``'s own error where it raised one, and
    leaves the caller's current stream, and the device's generators, as they were (:func:`_end_capture_mode`)."""
    with torch.cuda.device(device):
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            body()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if generator is not default_generator(device):  # that one is registered
            graph.register_generator_state(generator)
        raised: list[BaseException] = []

        def guarded() -> None:
            try:
                body()
            except BaseException as exc:
                raised.append(exc)
                raise

        try:
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
                guarded()
        except BaseException as exc:
            torch.cuda.set_stream(current)
            _end_capture_mode(device)
            raise (raised[0] if raised else exc) from None
        finally:
            torch.cuda.set_stream(current)  # graph's __exit__ skips it when ending the capture raises

    def replay() -> None:
        with torch.cuda.device(device):
            graph.replay()

    return replay


def _end_capture_mode(device: torch.device) -> None:
    """Takes ``device``'s default generator out of capture mode after a failed capture. PyTorch's ``capture_begin``
    puts it there (with every generator registered with the graph), and only a ``capture_end`` that succeeds takes it
    out: when ending the capture raises (a capture a host sync invalidated), the generator stays in capture mode and
    its next draw outside a capture fails ("Offset increment outside graph capture encountered unexpectedly"), for
    every later run on the device. A capture of one kernel, which succeeds, ends it as PyTorch would have. (A
    generator of the chain's own, registered too, is dropped with the failed chain.)"""
    scratch = torch.zeros(1, device=device)
    with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=torch.cuda.Stream()):
        scratch.add_(1)


def capture_for(device: torch.device) -> Capture | None:
    """How to capture a graph on ``device`` (None: it has no graphs)."""
    return cuda_capture if device.type == "cuda" else None


def state_refusal(state: Any) -> Optional[str]:
    """Why a graph cannot hold ``state`` (a dataclass of tensors), or None."""
    if not dataclasses.is_dataclass(state):
        return f"its state is a {type(state).__name__}, not a dataclass of tensors"
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if value is not None and not isinstance(value, Tensor):
            return f"its state carries {field.name}, a Python value a graph would fix at capture"
    return None


def _children(value: Any) -> list[Any] | None:
    """The parts of a container (dataclass, tuple, list), or None for a leaf."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        return list(value)
    return None


def _describe(value: Any, tensor: Callable[[Tensor], Any]) -> Any:
    """A comparable description of ``value``: its containers and numbers as they are, each tensor as ``tensor(t)``
    (never a tensor compared with ``==``)."""
    if isinstance(value, Tensor):
        return tensor(value)
    parts = _children(value)
    if parts is None:
        return value
    return (type(value), tuple(_describe(p, tensor) for p in parts))


def _tensors(value: Any) -> list[Tensor]:
    """The tensors in ``value``, in a fixed order."""
    if isinstance(value, Tensor):
        return [value]
    return [t for p in _children(value) or () for t in _tensors(p)]


def has_tensors(value: Any) -> bool:
    """Whether ``value`` (a dataclass, tuple or list, nested) holds a tensor."""
    if isinstance(value, Tensor):
        return True
    return any(has_tensors(p) for p in _children(value) or ())


def _with_own_tensors(value: Any) -> Any:
    """``value`` with a copy of each of its tensors (containers shallow-copied, no ``__init__`` run)."""
    if isinstance(value, Tensor):
        return value.clone()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(out, f.name, _with_own_tensors(getattr(value, f.name)))
        return out
    if isinstance(value, (tuple, list)):
        return type(value)(_with_own_tensors(p) for p in value)
    return value


def _shape(t: Tensor) -> tuple:
    return (t.shape, t.dtype, t.device)


def _identity(t: Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.dtype, t.device)


def graph_key(
    energy: EnergyModel, program: Program, x: Tensor, params: Any, generator: Optional[torch.Generator], path: str
) -> tuple:
    """What a captured graph depends on besides tensors' values: the states' shape, dtype and device; the params'
    numbers and their tensors' shapes (their values are copied in at every call); whether a generator is given (its
    state is copied in); the energy's ``program`` with its numbers, the addresses of its parameters, buffers and
    arguments, every module's mode; ``path``, the backend selection and autocast (what the energy's kernels resolved
    to, and under what)."""
    args = program.args if isinstance(program, Analytic) else ()  # not part of Analytic's equality
    tensors = tuple((name, _identity(t)) for name, t in (*energy.named_parameters(), *energy.named_buffers()))
    autocast = (torch.is_autocast_enabled(x.device.type), torch.get_autocast_dtype(x.device.type))
    return (
        x.shape,
        x.dtype,
        x.device,
        _describe(params, _shape),
        generator is None,
        program,
        _describe(args, _identity),
        tensors,
        tuple(m.training for m in energy.modules()),
        path,
        selection(getattr(energy, "backend", None)),
        autocast,
    )


def kept_tensors(energy: EnergyModel, program: Program) -> list[Tensor]:
    """The tensors whose addresses :func:`graph_key` holds: kept alive with the graph, so no address is reused."""
    args = program.args if isinstance(program, Analytic) else ()
    return [*energy.parameters(), *energy.buffers(), *_tensors(args)]


class GraphChain:
    """A :data:`~ebmcore.sampler.Chain` factory: ``kernel(state, fns, generator, params)`` (the algorithm's step) run
    ``k`` times per replay of a graph ``capture`` made of it, with copies of ``params``' tensors and, for a given
    ``generator``, a generator of its own; :meth:`bind` gives the chain of a run with its params and generator.

    The step's info carries per-chain ``accepted`` and ``divergent`` where ``counts`` (summed per call into
    :class:`ChainInfo`). The graph's inputs are copies of ``state``'s tensors, made at construction; the capture runs
    there too. Each call copies its state, params and generator state in, replays, runs the remainder eagerly and
    returns copies (a graph's outputs are overwritten by its next replay); a call of fewer than ``k`` transitions
    replays nothing and runs them from the caller's state, copying nothing. ``keep``: tensors to keep alive with it."""

    def __init__(
        self,
        kernel: Callable[..., tuple[Any, Any]],
        fns: Any,
        params: Any,
        generator: Optional[torch.Generator],
        state: Any,
        counts: bool,
        capture: Capture,
        keep: list[Tensor],
        k: int = GRAPH_STEPS,
    ) -> None:
        device = state.x.device
        self.k, self.keep, self.fns = k, keep, fns
        self.params = _with_own_tensors(params)
        self.generator = None if generator is None else torch.Generator(device=device)
        self.step = lambda s: kernel(s, fns, self.generator, self.params)
        self.names = [f.name for f in dataclasses.fields(state) if getattr(state, f.name) is not None]
        self.static = dataclasses.replace(state, **{name: getattr(state, name).clone() for name in self.names})
        n = state.x.shape[0]
        self.accepted = torch.zeros(n, dtype=torch.int32, device=device) if counts else None
        self.divergent = torch.zeros(n, dtype=torch.int32, device=device) if counts else None
        drawn_from = self.generator if self.generator is not None else default_generator(device)
        rng = drawn_from.get_state()
        try:
            self.replay = capture(self._body, drawn_from, device)
        finally:  # a warm-up's draws are given back: the chain draws what the per-step loop would
            drawn_from.set_state(rng)

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

    def bind(self, params: Any, generator: Optional[torch.Generator]) -> Callable[[Any, int, int, int], tuple[Any, ChainInfo]]:
        """The chain of a run with ``params`` (the same structure as the captured ones) and ``generator`` (given
        when the captured one was; its state is used and advanced as the per-step loop would)."""
        pairs = [(mine, theirs) for mine, theirs in zip(_tensors(self.params), _tensors(params)) if mine is not theirs]

        def chain(state: Any, n: int, seed: int, offset: int) -> tuple[Any, ChainInfo]:
            for mine, theirs in pairs:
                mine.copy_(theirs)
            if generator is not None:
                self.generator.set_state(generator.get_state())
            out = self._run(state, n)
            if generator is not None:
                generator.set_state(self.generator.get_state())
            return out

        return chain

    def _run(self, state: Any, n: int) -> tuple[Any, ChainInfo]:
        if self.accepted is not None:
            self.accepted.zero_()
            self.divergent.zero_()
        if 0 < n < self.k:  # no replay: the steps from the caller's state, their outputs its own (no copy in or out)
            s = self._steps(state, n)
        else:
            for name in self.names:
                getattr(self.static, name).copy_(getattr(state, name))
            for _ in range(n // self.k):
                self.replay()
            s = self._steps(self.static, n % self.k)
            s = dataclasses.replace(s, **{name: getattr(s, name).clone() for name in self.names})
        if self.accepted is None:
            return s, ChainInfo(None, None)
        return s, ChainInfo(self.accepted.clone(), self.divergent.clone())
