"""What every algorithm module is built from: the :class:`Algorithm` record, the shared state of the
samplers that accept or reject, drawing a step's random numbers, and resolving a fused chain kernel.

Each algorithm module (``langevin``, ``mala``, ``hmc``, ``nuts``, ``annealed``, ``tempering``)
exports ``State``, ``Info``, ``Params``, ``init(x, fns) -> State`` and
``build_kernel(**static) -> step``, where ``step(state, fns, generator, params) -> (State, Info)``
makes one transition of every chain with resolved params (``Params(...).resolve(x)``), and an
``ALGORITHM`` record that the object API (:class:`ebm_samplers.AlgorithmSampler`) reads. A third
party can write the same module shape and get every feature of the first-party samplers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.energies.program import Analytic, Opaque, Program
from ebmcore.errors import BackendUnavailableError, UnknownComponentError
from ebmcore.kernels import Kernel, resolve_kernel
from ebmcore.kernels.resolve import fused_op, fused_ops
from ebmcore.sampler import Chain
from ebm_samplers.params import IDENTITY

__all__ = [
    "Algorithm",
    "Step",
    "Chain",
    "ChainInfo",
    "StepLoop",
    "GradientState",
    "init_gradient_state",
    "DIVERGENCE_THRESHOLD",
    "draw_then",
    "compiled",
    "identity_mass_refusal",
    "chain_kernel",
    "fused_chain",
    "FusedChain",
]

DIVERGENCE_THRESHOLD = 1000.0
"""A transition whose energy error (``−log`` of its acceptance ratio) exceeds this is divergent (as in Stan)."""


Step = Callable[[Any, EnergyFunctions, Optional[torch.Generator], Any], tuple[Any, Any]]
"""``step(state, fns, generator, params) -> (state, info)``: one transition of every chain."""


@dataclass(frozen=True)
class ChainInfo:
    """What a fused run of ``n`` transitions reports per chain: ``accepted`` and ``divergent`` counts ``(n_chains,)``
    (None for samplers without accept/reject)."""

    accepted: Optional[Tensor]
    divergent: Optional[Tensor]


@dataclass(frozen=True)
class Algorithm:
    """What the object API needs to know about an algorithm.

    ``options(energy, **static) -> dict``: checks the static options of ``build_kernel`` (fixed for
    a sampler: integrator, schedule) and fills their defaults; ``has_acceptance``: its ``Info``
    carries ``accepted``, ``acceptance_prob`` and ``divergent``; ``build_chain(energy, fns, x,
    params, fused, **static) -> Chain | StepLoop | reason``: a fused multi-step chain where a kernel
    backend provides one (a chain may declare what it computes in its own type: ULA's ``ULAChain``; None: the
    algorithm has no chain); ``energy_of(state, fns, **static)``: ``E`` at the
    state's positions for diagnostics (None: ``state.energy`` if the state carries it, else
    ``fns.energy(state.x)``); ``compile_refusal``: why ``compile=True`` cannot apply (None:
    ``build_kernel`` takes ``compile``); ``graph_refusal``: why its transition cannot be captured in a CUDA graph
    (a host sync in it; None: it can, :mod:`ebm_samplers.graphs`); ``warmup(sampler, x0, n_warmup, *,
    target_accept, generator) -> result`` with ``result.x``, ``result.tunables`` and ``result.acceptance``: the
    algorithm's own warm-up (ChEES's, MEADS's), which ``ebm sample`` runs in place of the generic
    :func:`ebm_samplers.adaptation.warmup` (None: the generic one); ``warmup_adapts``: what it adapts, for
    people (``{target_accept}`` is filled in), in the run's report.
    """

    name: str
    Params: type
    init: Callable[[Tensor, EnergyFunctions], Any]
    build_kernel: Callable[..., Step]
    has_acceptance: bool
    options: Callable[..., dict[str, Any]] = lambda energy: {}
    build_chain: Optional[Callable[..., "Chain | str"]] = None
    energy_of: Optional[Callable[..., Tensor]] = None
    compile_refusal: Optional[str] = None
    graph_refusal: Optional[str] = None
    warmup: Optional[Callable[..., Any]] = None
    warmup_adapts: str = ""


@cache
def compiled(transition: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(transition)``, one wrapper per function and process (so repeated runs reuse its graphs)."""
    return torch.compile(transition, dynamic=False)


def draw_then(transition: Callable[..., Any], *, uniform: bool, bind: Callable[[Tensor], tuple[Any, ...]] = lambda x: ()) -> Step:
    """A ``step`` that draws ``ξ ~ N(0, I)`` like ``x`` (and, with ``uniform``, ``u ~ U[0, 1)`` per chain, in at
    least float32) from ``generator`` into buffers it keeps, then calls the deterministic
    ``transition(state, ξ, [u,] fns, params, *bind(x))``. The buffers (and ``bind``'s result, e.g. a resolved
    kernel) are made for the first state's shape, dtype and device, and again whenever those change."""
    held: list[Any] = [None, None, None, None]  # key, noise, uniform, bound

    def buffers(x: Tensor) -> tuple[Tensor, Tensor, tuple[Any, ...]]:
        key = (x.shape, x.dtype, x.device)
        if held[0] != key:
            u = torch.empty(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32), device=x.device) if uniform else None
            held[:] = [key, torch.empty_like(x), u, bind(x)]
        return held[1], held[2], held[3]

    if uniform:

        def step(state: Any, fns: EnergyFunctions, generator: Optional[torch.Generator], params: Any) -> tuple[Any, Any]:
            noise, u, bound = buffers(state.x)
            noise.normal_(generator=generator)
            u.uniform_(generator=generator)
            return transition(state, noise, u, fns, params, *bound)
    else:

        def step(state: Any, fns: EnergyFunctions, generator: Optional[torch.Generator], params: Any) -> tuple[Any, Any]:
            noise, _, bound = buffers(state.x)
            noise.normal_(generator=generator)
            return transition(state, noise, fns, params, *bound)

    return step


@dataclass(frozen=True)
class StepLoop:
    """What ``build_chain`` returns for a chain that launches kernels at every step (e.g. one fused Langevin move per
    step) rather than many steps per launch: on CUDA a captured graph of the transition is preferred where it can run."""

    chain: Chain


@dataclass(frozen=True)
class GradientState:
    """``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``: what the next
    step needs, so that an accepted proposal costs no recomputation."""

    x: Tensor
    energy: Tensor
    grad: Tensor


def init_gradient_state(x: Tensor, fns: EnergyFunctions) -> GradientState:
    """The state at ``x`` (one energy-and-gradient evaluation)."""
    energy, grad = fns.energy_and_gradient(x)
    return GradientState(x, energy, grad)


def identity_mass_refusal(params: Any) -> str | None:
    """Why a fused Hamiltonian chain (identity mass, one temperature for all chains) cannot run ``params``, or None."""
    if params.inv_mass is not IDENTITY:  # dense, low-rank: O(d²), O(d·k) products the fused kernels do not have
        kind = {"dense": "dense ", "low_rank": "low-rank "}.get(params.inv_mass.kind, "")
        return f"a {kind}mass matrix is set, the fused chain uses the identity"
    if not isinstance(params.temperature, float):
        return "per-chain temperatures are set"
    return None


def chain_kernel(op: str, energy: EnergyModel, x: Tensor, fused: bool | None, *static: Any) -> Kernel | str:
    """The kernel named ``op`` of a fused op (:mod:`ebmcore.kernels.fused`, provided by a backend such as
    ``ebm-cuda``) for states ``x``, or why none can run here; the per-step loop is what it competes with (a sampler's
    chains find their op through :func:`fused_chain`). With ``fused=None`` (automatic) a kernel
    is used only if it does not rank below the per-step loop (priority >= 0); ``fused=True`` takes any that can run.
    ``static``: the op's arguments that a kernel may refuse (:attr:`ebmcore.kernels.Kernel.refuses`)."""
    try:
        kernel = resolve_kernel(op, x.device, x.dtype, getattr(energy, "backend", None))
    except (BackendUnavailableError, UnknownComponentError) as exc:
        return f"no kernel for {op}: {str(exc).splitlines()[0]}"
    if kernel.max_event_size is not None and x[0].numel() > kernel.max_event_size:
        return f"the {op} kernel takes at most {kernel.max_event_size} elements per chain, got {x[0].numel()}"
    if fused is None and kernel.pays_up_to is not None and x[0].numel() > kernel.pays_up_to:
        return (
            f"the {op} kernel is slower than the per-step loop beyond {kernel.pays_up_to} elements per chain "
            f"(measured), got {x[0].numel()}; fused=True forces it"
        )
    refusal = kernel.refuses(*static) if kernel.refuses is not None else None
    if refusal:
        return f"the {op} kernel {refusal}"
    if kernel.priority < 0 and fused is None:
        return f"the {op} kernel ranks below the per-step loop here (priority {kernel.priority}); fused=True forces it"
    return kernel


def fused_chain(
    family: str, energy: EnergyModel, program: Program, x: Tensor, fused: bool | None, precision: str | None = None
) -> "FusedChain | str":
    """The one question a sampler asks: which kernel runs ``family`` (``"langevin_chain"``, ``"hmc_chain"``,
    ``"nuts_chain"``) on the energy's ``program`` for states ``x``, or why none does. The op is the one registered
    for ``(family, type(program))`` (:func:`ebmcore.kernels.resolve.fused_op`), its kernel named for the program
    (``gaussian_langevin_chain``, ``feedforward_langevin_chain``). Returns ``chain(x, **keywords)``: the kernel with
    the program's own arguments bound (the energy's parameters, or the network), called with the family's keywords.
    ``precision``: the products asked of a kernel that declares them (:func:`kernel_products`)."""
    op = fused_op(family, type(program))
    if op is None:
        if isinstance(program, Opaque) and any(o.family == family and o.program is not Analytic for o in fused_ops()):
            return program.reason  # what would let a kernel run it
        return f"{type(energy).__name__} is not an analytic energy"
    if isinstance(program, Analytic):
        bound, static = program.args, ()
    else:
        if torch.is_autocast_enabled(x.device.type):
            return "torch.autocast is on: the network runs in torch under it"
        bound, static = (program,), (program,)
    kernel = chain_kernel(op.kernel_name(program), energy, x, fused, *static)
    if isinstance(kernel, str):
        return kernel
    products = kernel_products(kernel, precision, fused)
    if isinstance(products, str):
        return products
    return FusedChain(kernel, bound, products)


def kernel_products(kernel: Kernel, precision: str | None, fused: bool | None) -> tuple[str] | str | None:
    """The products ``kernel`` computes with, fixed now, as a 1-tuple; None for a kernel that declares none (its
    products are its own: the host build's float32); a str: why it does not run at ``fused=None`` with them. A kernel
    declares them as ``kernel.fn.products(precision) -> (products, why not at fused=None or None)`` (``precision``
    None: its default, e.g. torch's switch for float32 products: ebm-cuda's Triton chains and its host chain, whose
    ``products`` None are its own float32 ones)."""
    declared = getattr(kernel.fn, "products", None)
    if declared is None:
        return None
    products, slower = declared(precision)
    if products is None:
        return None
    if slower is not None and fused is None:
        return f"the {kernel.op} kernel with {products} products {slower}; fused=True forces it"
    return (products,)


@dataclass(frozen=True)
class FusedChain:
    """A fused chain's kernel with the program's own arguments bound: ``chain(x, **keywords)`` calls
    ``kernel.fn(x, *bound, **keywords)`` (with ``precision=`` the declared ``products``, for a kernel that declares
    them: :func:`kernel_products`); ``kernel.backend`` names the backend it comes from."""

    kernel: Kernel
    bound: tuple
    declared: Optional[tuple[str]] = None

    @property
    def products(self) -> Optional[str]:
        """The products the kernel computes with (None: its own, undeclared)."""
        return None if self.declared is None else self.declared[0]

    @property
    def options(self) -> dict[str, Any]:
        """The keywords of the kernel's own options this chain passes: ``{"precision": products}`` or none."""
        return {} if self.declared is None else {"precision": self.declared[0]}

    def __call__(self, y: Tensor, **keywords: Any) -> Any:
        return self.kernel.fn(y, *self.bound, **self.options, **keywords)
