"""The object API shared by every sampler: ``Sampler(energy, ...).sample(x0, n_steps, ...)``.

A subclass supplies its functional pieces (``init_fn``, ``transition_fn``, ``step_fn``), whether it
accepts/rejects (``has_acceptance``), and :meth:`MCMCSampler.tunables`, which validates its
tunables once per call. :meth:`MCMCSampler.sample` then runs the hot loop: energy kernels resolved
once, random draws into preallocated buffers, trajectory and diagnostics into preallocated tensors,
no host synchronisation and no hook call until the loop ends.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Sampler
from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.errors import BackendUnavailableError, InputError, UnknownComponentError
from ebmcore.kernels import Kernel, resolve_kernel
from ebmcore.validation import check_finite

__all__ = ["MCMCSampler", "Diagnostics", "SampleResult", "NonFiniteChainsWarning", "DIVERGENCE_THRESHOLD", "FusedRunner"]

FusedRunner = Callable[[Any, int, int, int], tuple[Any, "Tensor | None", "Tensor | None"]]
"""``run(state, n_steps, seed, offset) -> (state, accepted, divergent)``: ``n_steps`` transitions in one
fused kernel call; ``accepted``/``divergent`` are per-chain counts ``(n,)``, or None without accept/reject."""

DIVERGENCE_THRESHOLD = 1000.0
"""A transition whose energy error (``−log`` of its acceptance ratio) exceeds this is divergent (as in Stan)."""


class NonFiniteChainsWarning(RuntimeWarning):
    """Some chains ended non-finite (ULA at too large a step size); they are reported, never clamped."""


@dataclass(frozen=True)
class Diagnostics:
    """Per-kept-step summaries over chains, and per-chain totals over the steps after burn-in.

    ``mean``, ``variance``: ``(n_kept, *event_shape)``; ``energy``: ``(n_kept,)`` mean energy;
    ``acceptance``: ``(n_kept,)`` fraction of chains that accepted at that step;
    ``acceptance_rate``: ``(n_chains,)``; ``divergences``: ``(n_chains,)`` counts of non-finite or
    diverging proposals; ``nonfinite_chains``: indices of chains non-finite at the end.
    Samplers without accept/reject (ULA) have ``None`` for the acceptance fields and divergences.
    """

    mean: Tensor
    variance: Tensor
    energy: Tensor
    acceptance: Tensor | None
    acceptance_rate: Tensor | None
    divergences: Tensor | None
    nonfinite_chains: Tensor
    wall_time: float


class SampleResult(NamedTuple):
    """What ``sample`` returns when a trajectory or diagnostics are asked for."""

    samples: Tensor
    trajectory: Tensor | None
    diagnostics: Diagnostics | None


def _with_autocast(fns: EnergyFunctions, dtype: torch.dtype, device_type: str) -> EnergyFunctions:
    """Evaluate the energy under ``torch.autocast`` and return results in the state's dtype."""

    def energy(x: Tensor) -> Tensor:
        with torch.autocast(device_type, dtype=dtype):
            return fns.energy(x).to(x.dtype)

    def gradient(x: Tensor) -> Tensor:
        with torch.autocast(device_type, dtype=dtype):
            return fns.gradient(x).to(x.dtype)

    def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast(device_type, dtype=dtype):
            e, g = fns.energy_and_gradient(x)
        return e.to(x.dtype), g.to(x.dtype)

    return EnergyFunctions(energy, gradient, energy_and_gradient)


def _traceable(energy: EnergyModel, fns: EnergyFunctions) -> EnergyFunctions:
    """For ``torch.compile``: an autograd gradient becomes ``torch.func.grad`` (which the compiler
    traces and fuses forward with backward) instead of ``torch.autograd.grad`` (a graph break)."""
    if type(energy).compute_gradient is not EnergyModel.compute_gradient or \
            type(energy).compute_energy_and_gradient is not EnergyModel.compute_energy_and_gradient:
        return fns  # analytic gradient: already traceable

    def total(x: Tensor) -> tuple[Tensor, Tensor]:
        e = energy.compute_energy(x)
        return e.sum(), e

    grad_and_value = torch.func.grad_and_value(total, has_aux=True)

    def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
        grad, (_, e) = grad_and_value(x)
        return e.detach(), grad.detach()

    return EnergyFunctions(fns.energy, lambda x: energy_and_gradient(x)[1], energy_and_gradient)


class MCMCSampler(Sampler):
    """Base of the object API. Options common to all samplers:

    ``autocast``: a dtype (``torch.bfloat16``, ``torch.float16``) to evaluate neural energies under
    ``torch.autocast``, the chain state keeping its own dtype. ``compile``: run the transition
    through ``torch.compile`` (random draws stay outside the compiled region).
    ``fused``: None (default) runs many steps per kernel launch when a backend provides a fused
    chain for this sampler, energy, device and dtype (``ebm-cuda``) at a positive priority and
    nothing needs every step (no ``callback``); True requires it (an error says why it cannot);
    False never uses it.
    The fused path draws its noise from a Philox stream seeded from ``generator``, so its samples
    differ from the per-step path's (both are reproducible).
    """

    name: ClassVar[str] = "mcmc"
    has_acceptance: ClassVar[bool] = True
    uses_noise_buffer: ClassVar[bool] = True
    compile_refusal: ClassVar[str] = "its steps draw their own random numbers"
    """True: ``transition_fn(state, noise, [uniform,] fns, ...)`` takes preallocated draws. False: the
    sampler draws a variable amount itself (NUTS) and the loop calls ``step_fn(..., generator=)``."""
    init_fn: Callable[..., Any]
    transition_fn: Callable[..., Any]
    step_fn: Callable[..., Any]

    def __init__(self, energy: EnergyModel, *, autocast: torch.dtype | None = None, compile: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(energy)
        if fused not in (None, True, False):
            raise InputError(f"fused must be None (automatic), True or False, got {fused!r}.")
        if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
            raise InputError(f"autocast must be torch.bfloat16 or torch.float16, got {autocast!r}.")
        if compile and not self.uses_noise_buffer:
            raise InputError(f"{type(self).__name__} does not support compile=True: {self.compile_refusal}.")
        self.autocast = autocast
        self.compile = bool(compile)
        self.fused = fused
        self._compiled: Callable[..., Any] | None = None
        self._bound: tuple[Any, EnergyFunctions] | None = None

    # -- to implement --------------------------------------------------------------------------

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments for ``transition_fn``/``step_fn`` (attributes, then ``overrides``)."""
        raise NotImplementedError

    def fused_runner(self, x: Tensor, fns: EnergyFunctions, params: dict[str, Any]) -> FusedRunner | str:
        """A fused multi-step runner for this run, or why there is none (override where one exists)."""
        return f"{type(self).__name__} has no fused chain kernels"

    def fused_kernel(self, x: Tensor, op: str) -> Kernel | str:
        """The kernel of ``op`` for ``x``, or why none can be used here. ``op`` names a fused op
        (:data:`ebmcore.kernels.ops.FUSED_OPS`); ``"<energy>_..."`` ops need an analytic energy."""
        if self.compile or self.autocast is not None:
            return "compile=True or autocast is set"
        if op.startswith("<energy>"):
            if not isinstance(self.energy, AnalyticEnergy):
                return f"{type(self.energy).__name__} is not an analytic energy"
            op = op.replace("<energy>", self.energy.op)
        try:
            kernel = resolve_kernel(op, x.device, x.dtype, getattr(self.energy, "backend", None))
        except (BackendUnavailableError, UnknownComponentError) as exc:
            return f"no kernel for {op}: {str(exc).splitlines()[0]}"
        if op != "langevin_step_philox" and x.dim() != 2:
            return f"the {op} kernel takes (n_chains, dim) states, got {tuple(x.shape)}"
        if kernel.max_event_size is not None and x[0].numel() > kernel.max_event_size:
            return f"the {op} kernel takes at most {kernel.max_event_size} elements per chain, got {x[0].numel()}"
        if kernel.priority < 0 and self.fused is None:
            return f"the {op} kernel ranks below the per-step loop here (priority {kernel.priority}); fused=True forces it"
        return kernel

    # -- the Sampler protocol --------------------------------------------------------------------

    def bind(self, x: Tensor) -> EnergyFunctions:
        """The energy's hot-loop callables for states like ``x`` (kernels resolved now)."""
        fns = self.energy.bind(x)
        if self.compile:
            fns = _traceable(self.energy, fns)
        return fns if self.autocast is None else _with_autocast(fns, self.autocast, x.device.type)

    def diagnostic_energy(self, state: Any, fns: EnergyFunctions) -> Tensor:
        """``E`` at the state's positions, for the diagnostics (the state's own if it carries one)."""
        return state.energy if hasattr(state, "energy") else fns.energy(state.x)

    def init_state(self, x: Tensor, fns: EnergyFunctions) -> Any:
        """The state at ``x`` given bound energy functions (override when the state is not ``init_fn``'s)."""
        return self.init_fn(x, fns)

    def init(self, x: Tensor) -> Any:
        """The state at ``x: (n_chains, *event_shape)`` (unchecked; ``sample`` checks ``x0``)."""
        return self.init_state(x, self.bind(x))

    def step(self, state: Any, *, generator: torch.Generator | None = None, **overrides: Any) -> tuple[Any, Any]:
        """One transition of every chain; ``overrides`` replace tunables for this step only.

        Convenient, not the hot path: it validates the tunables on every call (a host sync for
        per-chain tensors). Loops should use ``sample`` or the functional ``step`` with prepared
        tunables. The energy binding is cached per device and dtype.
        """
        key = (state.x.device, state.x.dtype)
        if self._bound is None or self._bound[0] != key:
            self._bound = (key, self.bind(state.x))
        return self.step_fn(state, self._bound[1], generator=generator, **self.tunables(state.x, overrides))

    # -- the loop --------------------------------------------------------------------------------

    def _one_step(self, x: Tensor, fns: EnergyFunctions, params: dict[str, Any],
                  generator: torch.Generator | None) -> Callable[[Any], tuple[Any, Any]]:
        """The loop body ``state -> (state, info)``, with its buffers allocated now."""
        if not self.uses_noise_buffer:
            step_fn = self.step_fn
            return lambda state: step_fn(state, fns, generator=generator, **params)
        transition = self.transition_fn
        if self.compile:
            if self._compiled is None:
                self._compiled = torch.compile(self.transition_fn, dynamic=False)
            transition = self._compiled
        noise = torch.empty_like(x)
        if not self.has_acceptance:
            def one_step(state: Any) -> tuple[Any, Any]:
                noise.normal_(generator=generator)
                return transition(state, noise, fns, **params)
            return one_step
        uniform = torch.empty(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)

        def one_step_mh(state: Any) -> tuple[Any, Any]:
            noise.normal_(generator=generator)
            uniform.uniform_(generator=generator)
            return transition(state, noise, uniform, fns, **params)
        return one_step_mh

    def sample(
        self,
        x0: Tensor,
        n_steps: int,
        *,
        burn_in: int = 0,
        thin: int = 1,
        return_trajectory: bool = False,
        return_diagnostics: bool = False,
        generator: torch.Generator | None = None,
        progress: bool = False,
        callback: Callable[[int, Any, Any], None] | None = None,
        **overrides: Any,
    ) -> Tensor | SampleResult:
        """Run ``burn_in`` steps, then ``n_steps`` steps keeping every ``thin``-th state.

        Returns the final states ``(n_chains, *event_shape)``; with ``return_trajectory`` or
        ``return_diagnostics`` a :class:`SampleResult` whose ``trajectory`` is
        ``(n_steps // thin, n_chains, *event_shape)`` (kept states after steps, not ``x0``).
        ``callback(step_index, state, info)`` runs after every step (burn-in included).
        ``overrides`` (``step_size=...``, ...) replace the sampler's tunables for this run.
        """
        for name, value, low in (("n_steps", n_steps, 0), ("burn_in", burn_in, 0), ("thin", thin, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        if generator is not None and isinstance(x0, Tensor) and generator.device.type != x0.device.type:
            raise InputError(f"generator is on {generator.device} but x0 is on {x0.device}; "
                             f"use torch.Generator(device={str(x0.device)!r}).manual_seed(...).")
        x = self.check_initial_state(x0)
        fns = self.bind(x)
        params = self.tunables(x, overrides)
        state = self.init_state(x, fns)
        for field in ("energy", "grad"):
            if hasattr(state, field):
                check_finite(getattr(state, field), what=f"{field} at the initial state x0", x=x,
                             fix="Start every chain where the energy and its gradient are finite.")
        runner = None
        if self.fused is not False:
            runner = self.fused_runner(x, fns, params) if callback is None else "a callback needs every step"
            if isinstance(runner, str):
                if self.fused:
                    raise InputError(f"{type(self).__name__}(fused=True): no fused chain can run: {runner}. "
                                     "Use fused=None to fall back to the per-step loop.")
                runner = None
        one_step = self._one_step(x, fns, params, generator) if runner is None else None
        n_chains = x.shape[0]
        n_kept = n_steps // thin
        trajectory = x.new_empty((n_kept, *x.shape)) if return_trajectory else None
        recorder = _Recorder(x, n_kept, self.has_acceptance, lambda state: self.diagnostic_energy(state, fns)) if return_diagnostics else None
        divergences = torch.zeros(n_chains, dtype=torch.int64, device=x.device) if self.has_acceptance else None
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=burn_in + n_steps, desc=type(self).__name__, unit="step")
        start = time.perf_counter()
        if runner is not None:
            state = _run_fused(runner, state, generator, burn_in, n_steps, thin, trajectory, recorder, divergences, bar)
        for i in range(burn_in + n_steps if runner is None else 0):
            state, info = one_step(state)
            kept = i - burn_in + 1
            if kept > 0:
                if divergences is not None:
                    divergences += info.divergent
                if recorder is not None:
                    recorder.accumulate(info)
                if kept % thin == 0:
                    if trajectory is not None:
                        trajectory[kept // thin - 1].copy_(state.x)
                    if recorder is not None:
                        recorder.record(kept // thin - 1, state, info)
            if callback is not None:
                callback(i, state, info)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - start
        nonfinite = (~torch.isfinite(state.x.flatten(1)).all(1)).nonzero().flatten()
        if nonfinite.numel():
            warnings.warn(
                f"{type(self).__name__}: {nonfinite.numel()} of {n_chains} chains became non-finite "
                f"(chains {nonfinite[:10].tolist()}{' ...' if nonfinite.numel() > 10 else ''}); they are left as they are. "
                "Reduce step_size, or use MALA/HMC, which reject such moves.",
                NonFiniteChainsWarning,
                stacklevel=2,
            )
        final = state.x.clone() if state.x is x0 else state.x  # never hand back the caller's own tensor
        if not (return_trajectory or return_diagnostics):
            return final
        diagnostics = recorder.finish(divergences, nonfinite, n_steps, wall) if recorder is not None else None
        return SampleResult(final, trajectory, diagnostics)


class _ChunkInfo(NamedTuple):
    accepted: Tensor  # per chain: the fraction of the chunk's transitions accepted


def _fused_seed(generator: torch.Generator | None, device: torch.device) -> int:
    """The Philox key of a fused run, drawn once from ``generator`` (or ``device``'s default generator,
    so ``torch.cuda.manual_seed`` makes fused GPU runs reproducible as it does per-step ones)."""
    where = generator.device if generator is not None else device
    return int(torch.randint(0, 2**62, (), generator=generator, device=where))


def _run_fused(runner: FusedRunner, state: Any, generator: torch.Generator | None, burn_in: int,
               n_steps: int, thin: int, trajectory: Tensor | None, recorder: "_Recorder | None",
               divergences: Tensor | None, bar: Any) -> Any:
    """Burn-in in one call, then one call per kept state (``thin`` steps) and the remainder, or one
    call for all ``n_steps`` when nothing records the kept states."""
    seed, offset = _fused_seed(generator, state.x.device), 0
    n_kept = n_steps // thin
    chunks = [(burn_in, None)] if burn_in else []
    if trajectory is None and recorder is None:
        chunks += [(n_steps, None)] if n_steps else []
    else:
        chunks += [(thin, k) for k in range(n_kept)] + ([(n_steps % thin, None)] if n_steps % thin else [])
    for index, (size, kept) in enumerate(chunks):
        state, accepted, divergent = runner(state, size, seed, offset)
        offset += size
        if index > 0 or not burn_in:  # after burn-in
            if divergences is not None and divergent is not None:
                divergences += divergent
            if recorder is not None and recorder.accepted is not None and accepted is not None:
                recorder.accepted += accepted
            if kept is not None:
                if trajectory is not None:
                    trajectory[kept].copy_(state.x)
                if recorder is not None:
                    fraction = accepted / size if accepted is not None else None
                    recorder.record(kept, state, _ChunkInfo(fraction))
        if bar is not None:
            bar.update(size)
    return state


class _Recorder:
    """Preallocated per-kept-step diagnostics."""

    def __init__(self, x: Tensor, n_kept: int, has_acceptance: bool, energy_of: Callable[[Any], Tensor]) -> None:
        stat_dtype = torch.promote_types(x.dtype, torch.float32)
        self.mean = torch.empty((n_kept, *x.shape[1:]), dtype=stat_dtype, device=x.device)
        self.variance = torch.empty_like(self.mean)
        self.energy = torch.empty(n_kept, dtype=stat_dtype, device=x.device)
        self.acceptance = torch.empty(n_kept, dtype=stat_dtype, device=x.device) if has_acceptance else None
        self.accepted = torch.zeros(x.shape[0], dtype=stat_dtype, device=x.device) if has_acceptance else None
        self.energy_of = energy_of

    def accumulate(self, info: Any) -> None:
        if self.accepted is not None:
            self.accepted += info.accepted

    @torch.no_grad()
    def record(self, k: int, state: Any, info: Any) -> None:
        x = state.x.to(self.mean.dtype)
        var, mean = torch.var_mean(x, dim=0, correction=1 if x.shape[0] > 1 else 0)
        self.mean[k] = mean
        self.variance[k] = var
        self.energy[k] = self.energy_of(state).to(self.energy.dtype).mean()
        if self.acceptance is not None:
            self.acceptance[k] = info.accepted.to(self.acceptance.dtype).mean()

    def finish(self, divergences: Tensor | None, nonfinite: Tensor, n_steps: int, wall: float) -> Diagnostics:
        rate = None if self.accepted is None else self.accepted / max(n_steps, 1)
        return Diagnostics(self.mean, self.variance, self.energy, self.acceptance, rate, divergences, nonfinite, wall)
