"""The fused ops, each defined once by its reference (:class:`FusedOp`): a pure-torch function whose signature is
the op's. An op is keyed by its ``family`` (``"langevin_chain"``) and the type of energy program it runs
(:mod:`ebmcore.energies.program`: ``FeedForward``, ``ConvStack``, ``Analytic``); plugins register ops through
their ``ebm_register_ops`` hook, the core's own among them (:mod:`ebmcore.builtin`), and a backend's kernel for an
op is held to the reference's signature when it is resolved (:func:`ebmcore.kernels.resolve.resolve_kernel`)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
from torch import Tensor

from ebmcore.energies import feedforward
from ebmcore.energies.program import Analytic, ConvStack, FeedForward

__all__ = [
    "FusedOp",
    "BUILTIN_FUSED_OPS",
    "op_of_kernel",
    "Normals",
    "Uniforms",
    "langevin_chain_reference",
    "hmc_chain_reference",
    "langevin_step_reference",
    "program_energy",
]

PROGRAM_PREFIX: dict[type, str] = {FeedForward: "feedforward", ConvStack: "conv", Analytic: "analytic"}
"""The word an op's registered name and its kernels' names start with, per program type (an analytic energy's
kernels start with the energy's own ``op``: ``gaussian_langevin_chain``)."""


@dataclass(frozen=True)
class FusedOp:
    """A fused op: ``family`` run on energy programs of type ``program`` (None: an op on plain tensors), defined by
    ``reference``, a pure-torch implementation whose signature is the op's. ``reference_only``: the keywords only
    the reference takes, documented in its docstring (the backend's noise stream, ``normal=``/``uniform=``, since
    each backend documents its own; the energy in torch where the op's arguments do not carry it). ``runs``: False
    where the reference is a signature only (NUTS: its kernels are held to the per-step sampler's law). ``prefix``:
    the word the op's kernel names start with (default by program type, :data:`PROGRAM_PREFIX`)."""

    family: str
    program: Optional[type]
    reference: Callable[..., Any]
    reference_only: tuple[str, ...] = ("normal",)
    runs: bool = True
    prefix: Optional[str] = None

    @property
    def key(self) -> tuple[str, Optional[type]]:
        return self.family, self.program

    @property
    def word(self) -> str:
        """The program's word: ``feedforward``, ``conv``, ``analytic`` ('' for an op on plain tensors)."""
        if self.prefix is not None:
            return self.prefix
        if self.program is None:
            return ""
        return PROGRAM_PREFIX.get(self.program, self.program.__name__.lower())

    @property
    def name(self) -> str:
        """The registered name: ``feedforward.langevin_chain``, ``analytic.hmc_chain``, ``langevin_step_philox``."""
        return f"{self.word}.{self.family}" if self.word else self.family

    def kernel_name(self, program: Any = None) -> str:
        """The name a backend registers its kernel under, for ``program`` (an ``Analytic``'s own op word)."""
        if isinstance(program, Analytic):
            return f"{program.op}_{self.family}"
        return f"{self.word}_{self.family}" if self.word else self.family

    def matches(self, kernel: str) -> bool:
        """Whether a kernel named ``kernel`` implements this op (for an analytic op: any energy's)."""
        if self.program is Analytic and self.prefix is None:
            suffix = f"_{self.family}"
            return kernel.endswith(suffix) and len(kernel) > len(suffix)
        return kernel == self.kernel_name()

    def parameters(self) -> list[inspect.Parameter]:
        """The op's parameters: the reference's, less its :attr:`reference_only` keywords."""
        params = inspect.signature(self.reference).parameters.values()
        return [p for p in params if p.name not in self.reference_only]

    @property
    def signature(self) -> str:
        """For people: ``(x: Tensor, network: FeedForward, *, n_steps: int, ...) -> Tensor``."""
        sig = inspect.signature(self.reference)
        shown = sig.replace(parameters=self.parameters())
        return str(shown).replace("'", "")

    def conformance(self, fn: Callable[..., Any]) -> Optional[str]:
        """Why ``fn`` cannot be called as the op is (None if it can): the reference's positional parameters come
        first, by name; where the reference takes ``*energy_args`` (an analytic energy's arguments) they follow
        positionally (``*args``, or parameters of their own), so its keywords must be keyword-only; otherwise a
        keyword may also be a positional-or-keyword parameter. Extra parameters with defaults are allowed (a kernel's
        own options, such as Triton's ``precision``); callables without a Python signature are not checked."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        kind = inspect.Parameter
        ours = self.parameters()
        want = [p.name for p in ours if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
        want_rest = any(p.kind is kind.VAR_POSITIONAL for p in ours)
        keywords = [p.name for p in ours if p.kind is kind.KEYWORD_ONLY]
        positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
        rest = any(p.kind is kind.VAR_POSITIONAL for p in params)
        any_keyword = any(p.kind is kind.VAR_KEYWORD for p in params)
        problems = []
        head, tail = [p.name for p in positional[: len(want)]], positional[len(want) :]
        if head != want:
            problems.append(
                f"has positional parameters ({', '.join(p.name for p in positional)}), the op's are ({', '.join(want)})"
            )
        if want_rest:  # the energy's arguments: *args, or parameters of their own; no keyword may sit among them
            if not rest and not tail:
                problems.append("does not take the energy's arguments (as *args or parameters of their own)")
            clash = [p.name for p in tail if p.name in keywords]
            if clash:
                problems.append(f"takes {', '.join(clash)} positionally, where the energy's arguments go: make them keyword-only")
        by_keyword = {
            p.name
            for p in params
            if p.kind is kind.KEYWORD_ONLY or (not want_rest and p.kind is kind.POSITIONAL_OR_KEYWORD and p in tail)
        }
        missing = [] if any_keyword else [k for k in keywords if k not in by_keyword]
        if missing:
            problems.append(f"lacks the keyword parameters {', '.join(missing)}")
        unpassed = [
            p.name
            for p in params
            if p.default is kind.empty
            and p.name not in keywords
            and (p.kind is kind.KEYWORD_ONLY or (not want_rest and p in tail))
        ]
        if unpassed:
            problems.append(f"requires parameters the op does not pass: {', '.join(unpassed)}")
        return "; ".join(problems) or None


def op_of_kernel(kernel: str, ops: Iterable[FusedOp]) -> Optional[FusedOp]:
    """The op a kernel named ``kernel`` implements among ``ops``, or None: the op of that exact name first, else an
    analytic op it is an instance of (``feedforward_langevin_chain`` is its own op, not the ``langevin_chain`` of an
    analytic energy called ``feedforward``)."""
    ops = tuple(ops)
    exact = next((op for op in ops if op.program is not Analytic and op.matches(kernel)), None)
    return exact or next((op for op in ops if op.matches(kernel)), None)


Normals = Callable[[int, int, int, int], Tensor]
"""``normal(n, d, seed, step) -> (n, d)`` float32: the standard normals a backend's chain adds at ``step`` of the
stream keyed by ``seed`` (``ebm-cuda``'s: ``ebm_cuda.reference.normal``, Philox4x32-10)."""

Uniforms = Callable[[int, int, int], Tensor]
"""``uniform(n, seed, step) -> (n,)`` float32 in [0, 1): the Metropolis uniforms of a backend's chain at ``step``."""


def _rows(value: Any, x: Tensor) -> Any:
    """A float, or per-chain values ``(n,)`` shaped to broadcast over ``x: (n, ...)``."""
    return value.reshape(-1, *[1] * (x.dim() - 1)).to(x) if isinstance(value, Tensor) and value.dim() > 0 else value


def _normal_like(normal: Normals, x: Tensor, seed: int, step: int) -> Tensor:
    return normal(x.shape[0], x[0].numel(), seed, step).reshape(x.shape).to(x)


def langevin_step_reference(
    x: Tensor, grad: Tensor, step_size: Any, noise_scale: Any, seed: int, offset: int, *, normal: Normals
) -> Tensor:
    """``langevin_step_philox``: ``x − h·grad + s·ξ`` with ``ξ = normal(n, d, seed, offset)``, in ``x``'s dtype."""
    return (x - _rows(step_size, x) * grad) + _rows(noise_scale, x) * _normal_like(normal, x, seed, offset)


def langevin_chain_reference(
    gradient: Callable[[Tensor], Tensor],
    x: Tensor,
    *,
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    normal: Normals,
) -> Tensor:
    """Every ``*_langevin_chain`` op: ``n_steps`` ULA moves ``x − h∇E(x) + s·ξ_t``, ``ξ_t = normal(n, d, seed,
    offset + t)``, in ``x``'s dtype (``x: (n, *event_shape)``; ``h``, ``s``: floats or ``(n,)``). Kernels that compute
    16-bit chains in float32 and round once per launch are compared with it on ``x.float()``, rounded at the end."""
    for t in range(n_steps):
        x = langevin_step_reference(x, gradient(x), step_size, noise_scale, seed, offset + t, normal=normal)
    return x


def hmc_chain_reference(
    energy_and_gradient: Callable[[Tensor], tuple[Tensor, Tensor]],
    x: Tensor,
    *,
    n_steps: int,
    step_size: Any,
    n_leapfrog_steps: int,
    inverse_temperature: float,
    seed: int,
    offset: int,
    normal: Normals,
    uniform: Uniforms,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every ``*_hmc_chain`` op: ``n_steps`` HMC transitions at inverse temperature ``β`` (identity mass, leapfrog with
    merged kicks), momenta ``normal(n, d, seed, offset + t)``, accepted where ``uniform(n, seed, offset + t)`` is below
    ``exp(−ΔH)``; a non-finite ``ΔH`` or one above 1000 is divergent (and rejected). In ``x``'s dtype. Returns ``x'``
    and the accepted and divergent counts ``(n,)`` int32."""
    n = x.shape[0]
    beta, h = inverse_temperature, _rows(step_size, x)
    e, g = energy_and_gradient(x)
    accepted = torch.zeros(n, dtype=torch.int32, device=x.device)
    divergent = torch.zeros(n, dtype=torch.int32, device=x.device)
    for t in range(n_steps):
        p = _normal_like(normal, x, seed, offset + t)
        k0 = (p * p).flatten(1).sum(1)
        xn, p = x.clone(), p - 0.5 * h * beta * g
        for step in range(n_leapfrog_steps):
            xn = xn + h * p
            en, gn = energy_and_gradient(xn)
            p = p - (0.5 if step + 1 == n_leapfrog_steps else 1.0) * h * beta * gn
        delta = (beta * en + 0.5 * (p * p).flatten(1).sum(1)) - (beta * e + 0.5 * k0)
        finite = torch.isfinite(delta)
        prob = torch.where(finite, torch.exp(-delta.clamp(min=0)), torch.zeros_like(delta))
        accept = uniform(n, seed, offset + t).to(x) < prob
        mask = accept.reshape(-1, *[1] * (x.dim() - 1))
        x = torch.where(mask, xn, x)
        e, g = torch.where(accept, en, e), torch.where(mask, gn, g)
        accepted += accept.to(torch.int32)
        divergent += (~finite | (delta > 1000)).to(torch.int32)
    return x, accepted, divergent


Gradient = Callable[[Tensor], Tensor]
"""``gradient(x) -> ∇ₓE(x)`` for ``x: (n, *event_shape)``: how a reference is given an energy its arguments do not
carry in torch."""


def program_energy(program: FeedForward | ConvStack, x: Tensor) -> Tensor:
    """``E(x): (n,)`` as ``program`` says, in plain torch (differentiable): the reference a program is held to."""
    if isinstance(program, FeedForward):
        return feedforward.forward(program, x)
    act = feedforward.math_of(program.activation).apply
    h = x
    for conv, stride in zip(program.convs, program.strides):
        h = act(torch.nn.functional.conv2d(h, conv.weight, conv.bias, stride=stride, padding=1))
    return torch.nn.functional.linear(h.mean((-2, -1)), program.head.weight, program.head.bias).squeeze(-1)


def _autograd_gradient(program: FeedForward | ConvStack) -> Gradient:
    def gradient(x: Tensor) -> Tensor:
        with torch.enable_grad():
            y = x.detach().requires_grad_(True)
            return torch.autograd.grad(program_energy(program, y).sum(), y)[0]

    return gradient


def analytic_langevin_chain(
    x: Tensor,
    *energy_args: Any,
    n_steps: int,
    step_size: float | Tensor,
    noise_scale: float | Tensor,
    seed: int,
    offset: int,
    gradient: Gradient,
    normal: Normals,
) -> Tensor:
    """``<op>_langevin_chain`` of an analytic energy (``energy_args``: its ``kernel_args()``): ULA by
    :func:`langevin_chain_reference`, ``x: (n, d) -> (n, d)``. Reference only: the energy as ``gradient``, and the
    backend's stream ``normal``."""
    return langevin_chain_reference(
        gradient, x, n_steps=n_steps, step_size=step_size, noise_scale=noise_scale, seed=seed, offset=offset, normal=normal
    )


def analytic_hmc_chain(
    x: Tensor,
    *energy_args: Any,
    n_steps: int,
    step_size: float | Tensor,
    n_leapfrog_steps: int,
    inverse_temperature: float,
    seed: int,
    offset: int,
    energy_and_gradient: Callable[[Tensor], tuple[Tensor, Tensor]],
    normal: Normals,
    uniform: Uniforms,
) -> tuple[Tensor, Tensor, Tensor]:
    """``<op>_hmc_chain`` of an analytic energy: HMC by :func:`hmc_chain_reference`, returning ``(x': (n, d),
    accepted: (n,), divergent: (n,))``. Reference only: the energy as ``energy_and_gradient``, the streams."""
    return hmc_chain_reference(
        energy_and_gradient,
        x,
        n_steps=n_steps,
        step_size=step_size,
        n_leapfrog_steps=n_leapfrog_steps,
        inverse_temperature=inverse_temperature,
        seed=seed,
        offset=offset,
        normal=normal,
        uniform=uniform,
    )


def analytic_nuts_chain(
    x: Tensor,
    *energy_args: Any,
    n_steps: int,
    step_size: float | Tensor,
    max_tree_depth: int,
    inverse_temperature: float,
    seed: int,
    offset: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``<op>_nuts_chain`` of an analytic energy: ``n_steps`` NUTS transitions, returning ``(x': (n, d), acceptance:
    (n,), divergent: (n,), n_leapfrog: (n,), tree_depth: (n,))``. A signature only: its kernels are held to the
    per-step sampler's law (``ebm_samplers.nuts``), not to a reference on their stream."""
    raise NotImplementedError("the NUTS chain has no reference on a backend's stream: compare it with the per-step sampler")


def feedforward_langevin_chain(
    x: Tensor,
    network: FeedForward,
    *,
    n_steps: int,
    step_size: float | Tensor,
    noise_scale: float | Tensor,
    seed: int,
    offset: int,
    normal: Normals,
    gradient: Optional[Gradient] = None,
) -> Tensor:
    """ULA of the ``FeedForward`` program ``network``, ``x: (n, d) -> (n, d)``, by :func:`langevin_chain_reference`.
    Reference only: ``normal``, and ``gradient`` (default the program's closed form)."""
    if gradient is None:
        gradient = lambda y: feedforward.score_terms(network, y)[0]  # noqa: E731
    return langevin_chain_reference(
        gradient, x, n_steps=n_steps, step_size=step_size, noise_scale=noise_scale, seed=seed, offset=offset, normal=normal
    )


def conv_langevin_chain(
    x: Tensor,
    stack: ConvStack,
    *,
    n_steps: int,
    step_size: float | Tensor,
    noise_scale: float | Tensor,
    seed: int,
    offset: int,
    normal: Normals,
    gradient: Optional[Gradient] = None,
) -> Tensor:
    """ULA of the ``ConvStack`` program ``stack``, ``x: (n, C, H, W) -> (n, C, H, W)``, by
    :func:`langevin_chain_reference` (noise per image, C-order). Reference only: ``normal``, and ``gradient``
    (default autograd of :func:`program_energy`)."""
    return langevin_chain_reference(
        gradient or _autograd_gradient(stack),
        x,
        n_steps=n_steps,
        step_size=step_size,
        noise_scale=noise_scale,
        seed=seed,
        offset=offset,
        normal=normal,
    )


BUILTIN_FUSED_OPS: tuple[FusedOp, ...] = (
    FusedOp("langevin_chain", Analytic, analytic_langevin_chain, ("gradient", "normal")),
    FusedOp("hmc_chain", Analytic, analytic_hmc_chain, ("energy_and_gradient", "normal", "uniform")),
    FusedOp("nuts_chain", Analytic, analytic_nuts_chain, (), runs=False),
    FusedOp("langevin_step_philox", None, langevin_step_reference),
    FusedOp("langevin_chain", FeedForward, feedforward_langevin_chain, ("normal", "gradient")),
    FusedOp("langevin_chain", ConvStack, conv_langevin_chain, ("normal", "gradient")),
)
"""The core's fused ops (registered by :mod:`ebmcore.builtin` like any plugin's): the chains run many steps per
launch, the noise drawn inside the kernel from a counter-based stream keyed by ``seed`` at steps ``offset, offset +
1, ...`` (``ebm-cuda`` defines it: Philox4x32-10, ``ebm_cuda.reference``). Samplers call them when a backend
provides them (``fused=`` of the samplers) and otherwise run their torch path, so forcing ``EBM_BACKEND=torch``
selects the reference path."""
