"""The sampler base class and the loop every sampler shares.

A sampler implements the contract ``init(x) -> state`` and ``step(state, *, generator, **tunables)
-> (state, info)`` over a batch of chains. :meth:`Sampler.sample` is the one loop that runs any
sampler: burn-in, thinning, the kept trajectory, diagnostics, callbacks and a progress bar. It
asks the sampler once for a :class:`Run` (:meth:`Sampler.prepare`): by default ``init`` and
``step`` with the given tunables; a sampler may prepare more (tunables checked once, kernels
resolved, buffers allocated, a fused multi-step chain). The loop makes no host sync and no hook call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch import Tensor

from ebmcore.energies.base import EnergyModel
from ebmcore.errors import InputError
from ebmcore.recording import NonFiniteChainsWarning, Recorder, SampleResult, check_trajectory_fits
from ebmcore.validation import (
    all_finite,
    check_energy_output,
    check_finite,
    check_finite_start,
    check_generator,
    check_gradient_output,
    check_start,
)

log = logging.getLogger(__name__)

__all__ = [
    "Sampler",
    "SamplerState",
    "Run",
    "Chain",
    "Planned",
    "NoiseStream",
    "check_run_arguments",
    "stream_seed",
    "default_generator",
]


class SamplerState(Protocol):
    """Any sampler state: a plain container whose ``x: (n_chains, *event_shape)`` are the current positions."""

    x: Tensor


Chain = Callable[[Any, int, int, int], tuple[Any, Any]]
"""``chain(state, n_steps, seed, offset) -> (state, info)``: ``n_steps`` transitions in one fused kernel call, the
noise taken at steps ``offset, offset + 1, ...`` of the counter-based stream keyed by ``seed``; ``info.accepted``
and ``info.divergent`` are per-chain counts over the call (None without accept/reject)."""


@dataclass
class Run:
    """One run prepared by :meth:`Sampler.prepare`: the initial ``state``; ``step(state) -> (state, info)``, one
    transition with everything bound; ``chain``, a fused multi-step chain (None: one step at a time) and
    ``path``, the words for which of the two runs and why; ``energy_of(state)``: ``E`` at the state's positions,
    for diagnostics; ``keyed``: whether ``chain`` draws its noise from the stream its ``seed`` and ``offset`` name (False: from the
    generator, as ``step`` does, so that it computes what the per-step loop computes; no key is then drawn)."""

    state: Any
    step: Callable[[Any], tuple[Any, Any]]
    energy_of: Callable[[Any], Tensor]
    chain: Optional[Chain] = None
    path: str = "per-step loop"
    keyed: bool = True


@dataclass
class Planned:
    """A run of ``n_steps`` from ``x``, planned by :meth:`Sampler.plan`: the states checked, the run prepared and the
    noise stream's key drawn, once; :meth:`advance` executes it. ``run`` is what it executes (None: the sampler draws
    its states its own way, by its own ``sample`` or ``advance``, which :meth:`advance` calls); a caller that computes
    more with the same chain (a training loss, say) reads ``run.chain`` and ``seed``."""

    sampler: "Sampler"
    x: Tensor
    n_steps: int
    generator: Optional[torch.Generator]
    run: Optional[Run] = None
    seed: int = 0

    def advance(self, *, stacklevel: int = 3) -> Tensor:
        """The states after ``n_steps`` steps: what :meth:`Sampler.advance` returns (a warning about chains that
        became non-finite points ``stacklevel`` frames up, counted as ``warnings.warn`` counts from here)."""
        sampler, run = self.sampler, self.run
        if run is None:
            own = sampler.sample if type(sampler).sample is not Sampler.sample else sampler.advance
            return own(self.x, self.n_steps, generator=self.generator)
        state = run.state
        if run.chain is not None:
            if self.n_steps:
                state, _ = run.chain(state, self.n_steps, self.seed, 0)
        else:
            for _ in range(self.n_steps):
                state, _ = run.step(state)
        sampler.warn_nonfinite(state.x, stacklevel=stacklevel + 1)
        return state.x.clone() if state.x is self.x else state.x


def check_run_arguments(
    x0: Any, n_steps: int, burn_in: int = 0, thin: int = 1, generator: Any = None, callback: Any = None
) -> None:
    """Clear errors for bad step counts, states on the ``meta`` device, a generator that is not one, or not on
    ``x0``'s device, and a callback that cannot be called."""
    if callback is not None and not callable(callback):
        raise InputError(
            f"callback must be a function callback(step_index, state, info) or None, got {type(callback).__name__} {callback!r}."
        )
    for name, value, low in (("n_steps", n_steps, 0), ("burn_in", burn_in, 0), ("thin", thin, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            kind = "non-negative" if low == 0 else "positive"
            raise InputError(f"{name} must be an integer >= {low} (a {kind} integer), got {value!r}.")
    check_generator(generator, x0)
    if isinstance(x0, Tensor) and x0.device.type == "meta":
        raise InputError(
            "x0 is on the meta device, which holds shapes but no values: a chain cannot run there. "
            "Sample on 'cpu' or 'cuda' (energy.to(device), x0.to(device)); an energy's compute_* methods take meta "
            "tensors, for shapes."
        )


@dataclass
class NoiseStream:
    """Where a fused run is in its counter-based noise stream: the key (None: not drawn yet) and the next step.
    Pass the same one to successive ``sample`` calls and they draw the noise of one uninterrupted run."""

    seed: Optional[int] = None
    offset: int = 0


def default_generator(device: torch.device) -> torch.Generator:
    """The generator that draws for ``device`` when a call is given none: the CUDA device's default (the current
    device's for a bare ``cuda``; initialises CUDA), or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def stream_seed(generator: torch.Generator | None, device: torch.device) -> int:
    """The key of a fused run's noise stream, drawn once from ``generator`` (or ``device``'s default generator,
    so ``torch.cuda.manual_seed`` makes fused GPU runs reproducible as it does per-step ones).

    On the CPU it is one ``torch.randint`` draw. A CUDA generator's draw would land on the device and reading it
    back would wait for the GPU (a host sync in every ``sample()`` call: on an H200 one ``sample(x, 1)`` call took
    0.45 ms against the per-step loop's 0.27). There the key is mixed on the host from the generator's seed and
    Philox offset, and the offset is advanced as one draw advances it, so the next call gets another key."""
    where = torch.device(generator.device if generator is not None else device)
    if where.type != "cuda":
        return int(torch.randint(0, 2**62, (), generator=generator, device=where))
    generator = generator if generator is not None else default_generator(where)
    with _OFFSET_LOCK:  # read and advance as one step: two threads sharing the generator get different keys
        offset = generator.get_offset()
        generator.set_offset(offset + 4)  # what one draw of a scalar advances (offsets move in multiples of 4)
    return host_key(generator.initial_seed(), offset)


_OFFSET_LOCK = threading.Lock()


def host_key(seed: int, offset: int) -> int:
    """A 62-bit key from a generator's ``(seed, offset)``: SplitMix64's finaliser of their combination, so
    neighbouring offsets and seeds give unrelated keys (Philox keyed by them then gives unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + offset + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 2


def _schedule(burn_in: int, n_steps: int, thin: int, per_step: bool, records: bool) -> Iterator[tuple[int, bool, int | None]]:
    """``(size, after_burn_in, kept index or None)`` for each advance: one transition at a time, or for a fused
    chain the burn-in in one call, then one call per kept state (``thin`` steps) and the remainder, or all
    ``n_steps`` in one call when nothing is recorded."""
    if per_step:
        for i in range(burn_in + n_steps):
            kept = i - burn_in + 1
            yield 1, kept > 0, (kept // thin - 1 if records and kept > 0 and kept % thin == 0 else None)
        return
    if burn_in:
        yield burn_in, False, None
    if not records:
        if n_steps:
            yield n_steps, True, None
        return
    for k in range(n_steps // thin):
        yield thin, True, k
    if n_steps % thin:
        yield n_steps % thin, True, None


@functools.cache
def _takes_n_steps(prepare: Callable[..., Run]) -> bool:
    """Whether a sampler's ``prepare`` takes the ``n_steps`` keyword (one written before it was added does not)."""
    parameters = inspect.signature(prepare).parameters.values()
    return any(p.name == "n_steps" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _progress_bar(show: bool, total: int, name: str) -> Any:
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="step")


class Sampler(ABC):
    """Draws samples from ``p(x) ∝ exp(−E(x))`` with many chains in parallel.

    A sampler *uses* an energy, it never owns it: it is not an ``nn.Module``,
    so moving or casting a sampler cannot touch the model. Subclasses
    implement :meth:`init` and :meth:`step`; tunables are arguments of
    ``step``, so adaptation can change them every step.
    """

    def __init__(self, energy: EnergyModel) -> None:
        if not isinstance(energy, EnergyModel):
            raise InputError(
                f"{type(self).__name__} needs an ebmcore.EnergyModel, got {type(energy).__name__}; "
                "subclass EnergyModel and implement compute_energy(x)."
            )
        self.energy = energy

    @abstractmethod
    def init(self, x: Tensor) -> SamplerState:
        """The state at positions ``x: (n_chains, *event_shape)`` (energy and gradient included where needed)."""

    @abstractmethod
    def step(self, state: Any, *, generator: torch.Generator | None = None, **tunables: Any) -> tuple[Any, Any]:
        """One transition of every chain: ``(new_state, info)``. No host sync, no hook call."""

    def check_initial_state(self, x0: Tensor) -> Tensor:
        """Check ``x0`` against the energy (shape, dtype, device), that it holds a chain at least and that it is finite
        (one sync)."""
        return check_start(self.energy, x0)

    @torch.no_grad()
    def check_initial_energy(self, x: Tensor, energy: Tensor, grad: Tensor | None = None) -> None:
        """Check the energy ``(n,)`` (and the gradient, shaped like ``x``, where the state carries one) at the
        checked initial states ``x``: shapes first (an ``(n, 1)`` energy names ``.squeeze(-1)``), then finiteness
        (one host sync). :meth:`sample` calls it once per run, for every sampler."""
        owner = type(self.energy).__name__
        fix = "Start every chain where the energy and its gradient are finite."
        check_finite(check_energy_output(energy, x, owner=owner), what=f"{owner} energy at the initial state x0", x=x, fix=fix)
        if grad is not None:
            check_finite(
                check_gradient_output(grad, x, owner=owner), what=f"{owner} gradient at the initial state x0", x=x, fix=fix
            )

    def _start(self, x0: Tensor) -> tuple[Tensor, bool]:
        """``x0`` checked and detached, and whether its finiteness is still to be checked: with the default
        :meth:`check_initial_state` only its metadata is checked here, and :meth:`_check_initial` folds its
        finiteness into the initial energy's (one host sync for both); an override is called as it is."""
        if type(self).check_initial_state is Sampler.check_initial_state:
            return check_start(self.energy, x0, finite=False).detach(), True
        return self.check_initial_state(x0).detach(), False

    @torch.no_grad()
    def _check_initial(self, x: Tensor, energy: Optional[Tensor], grad: Optional[Tensor], start_pending: bool) -> None:
        """What :meth:`check_initial_state` (where ``start_pending``) and :meth:`check_initial_energy` (where
        ``energy`` is given) check, in that order and with their words, in one host sync where both are the defaults:
        shapes first, then one sum over ``x``, the energy and the gradient; only a sum that is not finite takes the
        checks one by one, which name the rows."""
        if type(self).check_initial_energy is not Sampler.check_initial_energy:
            if start_pending:
                check_finite_start(x)
            if energy is not None:
                self.check_initial_energy(x, energy, grad)
            return
        if energy is not None:
            owner = type(self.energy).__name__
            check_energy_output(energy, x, owner=owner)
            if grad is not None:
                check_gradient_output(grad, x, owner=owner)
        tensors = [t for t in (x if start_pending else None, energy, grad) if t is not None]
        if not tensors or all_finite(*tensors):
            return
        if start_pending:
            check_finite_start(x)
        if energy is not None:
            self.check_initial_energy(x, energy, grad)

    def _prepared(
        self, x: Tensor, generator: Optional[torch.Generator], tunables: dict[str, Any], every_step: bool, n_steps: int
    ) -> Run:
        """:meth:`prepare`, told the run's ``n_steps`` where it takes them."""
        if _takes_n_steps(type(self).prepare):
            return self.prepare(x, generator, tunables, every_step, n_steps=n_steps)
        return self.prepare(x, generator, tunables, every_step=every_step)

    def prepare(
        self,
        x: Tensor,
        generator: torch.Generator | None,
        tunables: dict[str, Any],
        every_step: bool = False,
        *,
        n_steps: int | None = None,
    ) -> Run:
        """The :class:`Run` from checked states ``x``: :meth:`init`, and :meth:`step` with ``tunables`` and
        ``generator``. Override to do once what every step would repeat; ``every_step``: a callback needs every
        transition (no fused chain); ``n_steps``: the transitions the run makes, burn-in included (None: not known),
        for a sampler that leaves out what would not pay for so few (a captured graph for one step)."""
        state = self.init(x)
        energy = self.energy

        @torch.no_grad()
        def energy_of(s: Any) -> Tensor:
            return s.energy if hasattr(s, "energy") else energy.compute_energy(s.x)

        return Run(
            state,
            lambda s: self.step(s, generator=generator, **tunables),
            energy_of,
            path=f"per-step loop ({type(self).__name__}.step)",
        )

    def advance(self, x: Tensor, n_steps: int, *, generator: torch.Generator | None = None) -> Tensor:
        """The states ``(n_chains, *event_shape)`` after ``n_steps`` steps from ``x``: what
        ``sample(x, n_steps, generator=generator)`` returns, to the bit (for an energy that draws no random
        numbers of its own), for a loss that runs a sampler at every training step: :meth:`plan`, then
        :meth:`Planned.advance`. Chains that became non-finite are warned about, as by ``sample``. A sampler that
        overrides ``sample`` is run by it."""
        return self.plan(x, n_steps, generator=generator).advance(stacklevel=3)

    def plan(self, x: Tensor, n_steps: int, *, generator: torch.Generator | None = None) -> Planned:
        """:meth:`advance`'s run, planned once and not yet executed: it checks ``x`` (shape, dtype, device, finite)
        and, where the initial state carries them, the energy and gradient there, as ``sample`` does, but it does not
        evaluate the energy only to check it (ULA's state has none: one forward pass saved per call); it prepares the
        run and draws the noise stream's key as ``sample`` draws it, whatever ``n_steps``. A sampler that overrides
        ``sample`` or ``advance`` gets a plan that calls it (``run`` None)."""
        if type(self).sample is not Sampler.sample or type(self).advance is not Sampler.advance:
            return Planned(self, x, n_steps, generator)
        check_run_arguments(x, n_steps, generator=generator)
        x, pending = self._start(x)
        try:
            run = self._prepared(x, generator, {}, False, n_steps)
            energy, grad = getattr(run.state, "energy", None), getattr(run.state, "grad", None)
            energy = energy if isinstance(energy, Tensor) else None
            self._check_initial(x, energy, grad if energy is not None and isinstance(grad, Tensor) else None, pending)
        except Exception:
            if pending and not all_finite(x):  # a non-finite x0 is what is named, whatever it made fail
                check_finite_start(x)
            raise
        seed = stream_seed(generator, x.device) if run.chain is not None and run.keyed else 0
        return Planned(self, x, n_steps, generator, run, seed)

    def warn_nonfinite(self, x: Tensor, stacklevel: int = 3) -> Tensor:
        """The indices of the chains of ``x: (n_chains, ...)`` that are not finite (one host sync), with a
        :class:`NonFiniteChainsWarning` naming them when there are any (for the caller of ``sample``/``advance``)."""
        if all_finite(x):
            return torch.empty(0, dtype=torch.long, device=x.device)
        nonfinite = (~torch.isfinite(x.flatten(1)).all(1)).nonzero().flatten()
        warnings.warn(
            f"{type(self).__name__}: {nonfinite.numel()} of {x.shape[0]} chains became non-finite "
            f"(chains {nonfinite[:10].tolist()}{' ...' if nonfinite.numel() > 10 else ''}); they are left as they are. "
            "Reduce step_size, or use MALA/HMC, which reject such moves.",
            NonFiniteChainsWarning,
            stacklevel=stacklevel,
        )
        return nonfinite

    def sample(
        self,
        x0: Tensor,
        n_steps: int,
        *,
        burn_in: int = 0,
        thin: int = 1,
        return_trajectory: bool = False,
        return_diagnostics: bool = False,
        return_stats: bool = False,
        generator: torch.Generator | None = None,
        progress: bool = False,
        callback: Callable[[int, Any, Any], None] | None = None,
        stream: NoiseStream | None = None,
        **tunables: Any,
    ) -> Tensor | SampleResult:
        """Run ``burn_in`` steps, then ``n_steps`` steps keeping every ``thin``-th state, for every chain of ``x0``.

        Returns the final states ``(n_chains, *event_shape)``; with ``return_trajectory``, ``return_diagnostics``
        or ``return_stats`` a :class:`SampleResult` whose ``trajectory`` is
        ``(n_steps // thin, n_chains, *event_shape)`` (kept states after steps, not ``x0``) and whose ``stats``
        are per-draw sampler statistics ``(n_steps // thin, n_chains)`` (:class:`~ebmcore.recording.SampleResult`).
        ``callback(step_index, state, info)`` runs after every step (burn-in included). ``stream``: where a fused
        chain's noise stream stands (it is advanced); by default a key is drawn from ``generator`` for this run.
        ``tunables`` (``step_size=...``, ...) go to :meth:`prepare` (by default, to every ``step``).
        """
        check_run_arguments(x0, n_steps, burn_in, thin, generator, callback)
        x, pending = self._start(x0)  # no graph through the chain, whatever x0 requires
        try:
            if return_trajectory:
                check_trajectory_fits(x, n_steps // thin)
            run = self._prepared(x, generator, tunables, callback is not None, burn_in + n_steps)
            grad = getattr(run.state, "grad", None)
            with torch.no_grad():  # the energy at x0 for the check only: no graph through the model's parameters
                energy0 = run.energy_of(run.state)
            self._check_initial(x, energy0, grad if isinstance(grad, Tensor) else None, pending)  # x0's finiteness too
        except Exception:
            if pending and not all_finite(x):  # a non-finite x0 is what is named, whatever it made fail
                check_finite_start(x)
            raise
        log.debug("%s: %d chains of shape %s, %s", type(self).__name__, x.shape[0], tuple(x.shape[1:]), run.path)
        recording = return_trajectory or return_diagnostics or return_stats
        recorder = Recorder(
            x,
            n_steps // thin,
            trajectory=return_trajectory,
            diagnostics=return_diagnostics,
            energy_of=run.energy_of,
            stats=return_stats,
        )
        if run.chain is None:
            step = run.step
            advance = lambda state, size, offset: step(state)  # noqa: E731
        elif not run.keyed:
            chain = run.chain
            advance = lambda state, size, offset: chain(state, size, 0, 0)  # noqa: E731
        else:
            stream = stream if stream is not None else NoiseStream()
            if stream.seed is None:
                stream.seed = stream_seed(generator, x.device)
            chain, key, start_at = run.chain, stream.seed, stream.offset
            advance = lambda state, size, offset: chain(state, size, key, start_at + offset)  # noqa: E731
        bar = _progress_bar(progress, burn_in + n_steps, type(self).__name__)
        state, done = run.state, 0
        start = time.perf_counter()
        for size, counted, kept in _schedule(burn_in, n_steps, thin, run.chain is None, recording):
            state, info = advance(state, size, done)
            done += size
            if counted and return_diagnostics:
                recorder.count(info)
            if kept is not None:
                recorder.keep(kept, state, info, size)
            if callback is not None:
                callback(done - 1, state, info)
            if bar is not None:
                bar.update(size)
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - start
        if run.chain is not None and run.keyed:
            stream.offset += done
        nonfinite = self.warn_nonfinite(state.x)
        final = state.x.clone() if state.x is x else state.x  # never hand back the caller's own tensor
        if not recording:
            return final
        return SampleResult(final, recorder.trajectory, recorder.finish(nonfinite, n_steps, wall), recorder.stats)
