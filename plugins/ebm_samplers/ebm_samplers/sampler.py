"""The object API over an algorithm record: ``MALASampler(energy, step_size=0.3).sample(x0, n_steps)``.

An :class:`AlgorithmSampler` holds an energy, its algorithm's ``Params`` (checked when built), the
algorithm's static options, and how to run it (``autocast``, ``compile``, ``fused``). It meets the
core contract (``init``/``step``), and its :meth:`~AlgorithmSampler.prepare` does once per run what
every step would repeat, for the loop every sampler shares (``ebmcore.Sampler.sample``).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Sampler, plugins
from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.binding import bind_energy
from ebmcore.energies.program import Opaque
from ebmcore.sampler import Run
from ebmcore.errors import InputError
from ebmcore.kernels.resolve import selection
from ebm_samplers import graphs
from ebm_samplers.algorithm import Algorithm, StepLoop
from ebm_samplers.params import accepted_fields

__all__ = ["AlgorithmSampler"]


@functools.cache
def _static_names(options: Callable[..., Any]) -> list[str]:
    """The static options an algorithm's ``options(energy, **static)`` takes."""
    return list(inspect.signature(options).parameters)[1:]


_OWN_WAY = frozenset({"bind", "resolve", "_chain"})
"""The methods whose results :meth:`AlgorithmSampler._resolved` keeps: replaced on a sampler, nothing is kept."""


class AlgorithmSampler(Sampler):
    """A sampler built from an :class:`~ebm_samplers.algorithm.Algorithm` (``algorithm`` class attribute).

    Keywords are the algorithm's ``Params`` fields (``positional`` names those that may be passed
    by position) and its static options; and, for every algorithm: ``autocast`` (``torch.bfloat16``
    or ``torch.float16``: evaluate a neural energy under ``torch.autocast``, the chain state keeping
    its dtype), ``compile`` (the transition through ``torch.compile``, random draws outside) and
    ``fused`` (None: run many steps per kernel launch when a backend provides a fused chain for this
    algorithm, energy, device and dtype at priority >= 0 and nothing needs every step; True:
    require it; False: never). A fused chain draws its noise from a Philox stream keyed from the
    ``generator``, so its samples differ from the per-step path's (both are reproducible).
    """

    algorithm: ClassVar[Algorithm]
    positional: ClassVar[tuple[str, ...]] = ("step_size",)

    def __init__(
        self,
        energy: EnergyModel,
        *args: Any,
        autocast: torch.dtype | None = None,
        compile: bool = False,
        fused: bool | None = None,
        **keywords: Any,
    ) -> None:
        name = type(self).__name__
        if len(args) > len(self.positional):
            raise InputError(
                f"{name} takes at most {len(self.positional)} positional parameter(s) after the energy "
                f"({', '.join(self.positional)}), got {len(args)}."
            )
        keywords.update(zip(self.positional, args))
        static_names = _static_names(self.algorithm.options)
        params_names = accepted_fields(self.algorithm.Params)
        unknown = sorted(set(keywords) - set(static_names) - set(params_names))
        if unknown:
            accepted = params_names + static_names + ["autocast", "compile", "fused"]
            raise InputError(f"{name}: unknown parameter(s) {', '.join(unknown)}; it takes {', '.join(accepted)}.")
        super().__init__(energy)
        self._setup(
            self.algorithm.options(energy, **{k: v for k, v in keywords.items() if k in static_names}),
            self.algorithm.Params(**{k: v for k, v in keywords.items() if k in params_names}),
            autocast,
            compile,
            fused,
        )

    def _setup(
        self, options: dict[str, Any], params: Any, autocast: torch.dtype | None, compile: bool, fused: bool | None
    ) -> None:
        name = type(self).__name__
        self.options, self.params = options, params
        if not (fused is None or isinstance(fused, bool)):
            raise InputError(f"fused must be None (automatic), True or False, got {fused!r}.")
        if autocast is not None and not (isinstance(autocast, torch.dtype) and autocast in (torch.bfloat16, torch.float16)):
            raise InputError(f"autocast must be torch.bfloat16 or torch.float16, got {autocast!r}.")
        if compile and self.algorithm.compile_refusal:
            raise InputError(f"{name} does not support compile=True: {self.algorithm.compile_refusal}.")
        self.autocast, self.compile, self.fused = autocast, bool(compile), fused
        self._graph: tuple[tuple, graphs.GraphChain | str] | None = None  # the last capture (or why it failed), its key
        self._resolution: tuple[tuple, tuple] | None = None  # the last run's resolution, its key (_resolved)
        self._ran = False  # whether a run was prepared: the first keeps no resolution (_resolved)
        self._params_checked: tuple[Any, bool] | None = None  # params, and whether they hold tensors (_resolution_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params}, options={self.options})"

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle keeps: all but the last run's resolution (bound callables, resolved again)."""
        return {**self.__dict__, "_resolution": None}

    def bind(self, x: Tensor) -> EnergyFunctions:
        """The energy's hot-loop callables for states like ``x`` (kernels resolved now; see :func:`bind_energy`)."""
        return bind_energy(self.energy, x, autocast=self.autocast, traceable=self.compile)

    def init(self, x: Tensor) -> Any:
        """The state at ``x: (n_chains, *event_shape)`` (unchecked; ``sample`` checks ``x0``)."""
        return self.algorithm.init(x, self.bind(x))

    def resolve(self, x: Tensor, overrides: dict[str, Any] | None = None) -> Any:
        """The params a run from states like ``x`` uses: this sampler's, with ``overrides`` (``step_size=...``) replaced."""
        if overrides:
            unknown = sorted(set(overrides) - set(accepted_fields(self.algorithm.Params)))
            if unknown:
                raise InputError(
                    f"{type(self).__name__}: unknown tunable(s) {unknown}; it takes "
                    f"{', '.join(accepted_fields(self.algorithm.Params))}."
                )
        return (replace(self.params, **overrides) if overrides else self.params).resolve(x)

    def step(self, state: Any, *, generator: torch.Generator | None = None, **overrides: Any) -> tuple[Any, Any]:
        """One transition of every chain; ``overrides`` replace params for this step only. Convenient, not the hot
        path: it checks the params and binds the energy on every call (``sample`` does that once per run)."""
        return self.kernel()(state, self.bind(state.x), generator, self.resolve(state.x, overrides))

    def kernel(self) -> Any:
        """The algorithm's ``step(state, fns, generator, params)`` with this sampler's static options (and ``compile``)."""
        return self.algorithm.build_kernel(**self.options, **({"compile": True} if self.compile else {}))

    def prepare(
        self,
        x: Tensor,
        generator: torch.Generator | None,
        overrides: dict[str, Any],
        every_step: bool = False,
        *,
        n_steps: int | None = None,
    ) -> Run:
        """Everything a run from checked states ``x`` needs, resolved once: params (with ``overrides``), the
        energy's kernels, the initial state, the transition and, where one can run and ``every_step`` is
        False, a fused chain; ``n_steps``: the run's transitions where known (fewer than a graph replay's
        :data:`graphs.GRAPH_STEPS`: no graph is captured for it, the per-step loop computes what it would).
        What does not depend on ``x``'s values is kept for the next run from states like ``x``
        (:meth:`_resolved`)."""
        fns, params, chain, reason = self._resolved(x, overrides, every_step)
        state = self.algorithm.init(x, fns)
        kernel = self.kernel()
        step = lambda s: kernel(s, fns, generator, params)  # noqa: E731
        path, graphed = getattr(chain, "path", "fused chain"), False
        if reason is not None or isinstance(chain, StepLoop):
            chain, path, graphed, why = self._graph_chain(chain, reason, every_step, fns, state, params, generator, n_steps)
            if chain is None and self.fused and why is not None:
                raise InputError(
                    f"{type(self).__name__}(fused=True): no fused chain can run: {why}. "
                    "Use fused=None to fall back to the per-step loop."
                )
        if fns.path:
            path = f"{path}; gradient: {fns.path}"
        if self.algorithm.energy_of is not None:
            energy_of = lambda s: self.algorithm.energy_of(s, fns, **self.options)  # noqa: E731
        else:
            energy_of = (lambda s: s.energy) if hasattr(state, "energy") else (lambda s: fns.energy(s.x))
        return Run(state, step, energy_of, chain, path, keyed=not graphed)

    def _graph_chain(
        self,
        loop: StepLoop | None,
        reason: str | None,
        every_step: bool,
        fns: EnergyFunctions,
        state: Any,
        params: Any,
        generator: torch.Generator | None,
        n_steps: int | None = None,
    ) -> tuple[Any, str, bool, str | None]:
        """Where no chain runs many steps per launch (``reason``: why; ``loop``: a chain that launches at every step):
        on a device with graphs, :data:`graphs.GRAPH_STEPS` transitions per replay of a captured graph
        (:mod:`ebm_samplers.graphs`), else ``loop``'s chain or the per-step loop; the run's path, saying why; whether
        it is a graph; and why it is what it is (the path's words in parentheses; None where nothing is missing: a run
        of fewer than ``GRAPH_STEPS`` transitions, ``n_steps``, would replay no graph, and the per-step loop computes
        what the graph's own steps would, so none is captured for it)."""
        capture = graphs.capture_for(state.x.device)
        if capture is None or self.fused is False or every_step or self.compile or self.autocast is not None:
            if loop is None:
                return None, f"per-step loop ({reason})", False, str(reason)
            return loop.chain, "fused chain", False, "the fused chain launches kernels at every step"
        why = reason if loop is None else "the fused chain launches kernels at every step"
        program = self.energy.program()
        refusal = self.algorithm.graph_refusal or graphs.state_refusal(state)
        if refusal is None and isinstance(program, Opaque) and not self.fused:
            refusal = (
                "fused=True captures the transitions of an energy ebm does not read (its Python code then runs once, at capture)"
            )
        if refusal is None and loop is None and n_steps is not None and n_steps < graphs.GRAPH_STEPS:
            return None, f"per-step loop ({why}; no CUDA graph for {n_steps} transition(s), fewer than one replay's)", False, None
        if refusal is None:
            refusal, chain = self._captured(program, fns, state, params, generator, capture)
        if refusal is not None:
            where = "per-step loop" if loop is None else "fused chain, one launch per step"
            why = f"{why}; no CUDA graph: {refusal}"
            return (None if loop is None else loop.chain), f"{where} ({why})", False, why
        return chain, f"CUDA graph, {graphs.GRAPH_STEPS} transitions per launch ({why})", True, why

    def _captured(
        self,
        program: Any,
        fns: EnergyFunctions,
        state: Any,
        params: Any,
        generator: torch.Generator | None,
        capture: graphs.Capture,
    ) -> tuple[str | None, Any]:
        """The captured graph of this run's transition, bound to its params and generator: the sampler's last one
        where :func:`graphs.graph_key` is unchanged, else a new capture; or why it cannot be captured (a failure is
        remembered with its key, not tried again)."""
        key = graphs.graph_key(self.energy, program, state.x, params, generator, fns.path)
        if self._graph is None or self._graph[0] != key:
            self._graph = None
            try:
                graph: Any = graphs.GraphChain(
                    self.kernel(),
                    fns,
                    params,
                    generator,
                    state,
                    self.algorithm.has_acceptance,
                    capture,
                    graphs.kept_tensors(self.energy, program),
                )
            except Exception as exc:  # a host sync, or an op capture does not take: the exact per-step fallback
                graph = f"capturing one failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            self._graph = (key, graph)
        graph = self._graph[1]
        return (graph, None) if isinstance(graph, str) else (None, graph.bind(params, generator))

    def _resolved(
        self, x: Tensor, overrides: dict[str, Any], every_step: bool
    ) -> tuple[EnergyFunctions, Any, Any, Optional[str]]:
        """The energy's bound callables, the resolved params and the fused chain (or why none runs) for a run from
        states like ``x``: the last run's where :meth:`_resolution_key` is unchanged (a run of small calls then
        resolves kernels, params and chain once, not at every call), else resolved now; from the sampler's second
        run on, so that a sampler made for one call costs no more than before."""
        # a sampler's first run keeps nothing: one made for one call (and dropped) pays no key
        key = None if overrides or not self._ran else self._resolution_key(x, every_step)
        self._ran = True
        held = self._resolution
        if key is not None and held is not None and held[0] == key:
            return held[1]
        fns = self.bind(x)
        params = self.resolve(x, overrides)
        chain, reason = self._chain(fns, x, params, every_step)
        resolved = (fns, params, chain, reason)
        self._resolution = None if key is None else (key, resolved)
        return resolved

    def _resolution_key(self, x: Tensor, every_step: bool) -> tuple | None:
        """Everything :meth:`_resolved`'s result depends on, for an analytic energy (whose binding reads only its
        op, its arguments and the backend selection) and params without tensors (resolved from ``x``'s shape, dtype
        and device alone): the states' shape, dtype and device; the energy's op, the identity of each argument
        tensor (read by the kernels at every call, so in-place updates are seen; the entry holds them, so no
        identity is reused) and its numbers; the backend selection and plugin session; torch's float32 product
        setting and autocast (a fused chain's products); this sampler's params, options and ``autocast``,
        ``compile``, ``fused``; ``every_step``. None where the result is not kept (another energy, a subclass or a
        sampler that binds, resolves or chooses its chain its own way, tensors among the params)."""
        energy, cls = self.energy, type(self)
        if not (
            isinstance(energy, AnalyticEnergy)
            and type(energy).bind is AnalyticEnergy.bind
            and type(energy).program is AnalyticEnergy.program  # Analytic(op, kernel_args())
            and cls.bind is AlgorithmSampler.bind
            and cls.resolve is AlgorithmSampler.resolve
            and cls._chain is AlgorithmSampler._chain
            and not _OWN_WAY.intersection(self.__dict__)  # nor replaced on this sampler (ebm profile counts binds)
        ):
            return None
        checked = self._params_checked
        if checked is None or checked[0] is not self.params:  # asked once per params object
            checked = self._params_checked = (self.params, graphs.has_tensors(self.params))
        if checked[1]:
            return None
        return (
            x.shape,
            x.dtype,
            x.device,
            energy.op,
            tuple((id(a), a) if isinstance(a, Tensor) else (None, a) for a in energy.kernel_args()),  # its program's
            selection(energy.backend),
            plugins.session(),
            torch.get_float32_matmul_precision(),
            torch.is_autocast_enabled(x.device.type),
            self.params,
            self.options,
            (self.autocast, self.compile, self.fused, every_step),
        )

    def _chain(self, fns: EnergyFunctions, x: Tensor, params: Any, every_step: bool) -> tuple[Any, Optional[str]]:
        """The algorithm's fused chain (``build_chain``'s result), or None and why none runs."""
        if self.fused is False:
            return None, "fused=False"
        if self.algorithm.build_chain is None:
            return None, f"{type(self).__name__} has no fused chain kernels"
        if every_step:
            return None, "a callback needs every step"
        if self.compile or self.autocast is not None:
            return None, "compile=True or autocast is set"
        chain = self.algorithm.build_chain(self.energy, fns, x, params, self.fused, **self.options)
        return (None, chain) if isinstance(chain, str) else (chain, None)
