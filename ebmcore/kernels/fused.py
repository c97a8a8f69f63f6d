"""The fused ops, each defined once (:class:`FusedOp`): the parameters every implementation takes and what it
returns. A backend whose kernel does not take an op's parameters is refused when it is built
(:meth:`ebmcore.KernelBackend.add`). Plugins define the fused ops of their own components the same way (the losses':
``ebm_losses.ops.LOSS_OPS``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = [
    "FusedOp",
    "FUSED_OPS",
    "fused_op",
    "Normals",
    "Uniforms",
    "langevin_chain_reference",
    "hmc_chain_reference",
    "langevin_step_reference",
]


@dataclass(frozen=True)
class FusedOp:
    """A fused op, defined once: the parameters every implementation takes and what it returns.

    ``positional`` and ``keywords`` (keyword-only) are ``"name: shape or type"``; ``"*name"`` takes the rest
    positionally (an analytic energy's ``kernel_args()``). A name starting with ``<energy>`` defines one op per
    analytic energy (``gaussian_langevin_chain``, ...). :meth:`conformance` holds an implementation's Python signature
    to the definition: a backend that adds a kernel whose parameters differ is refused when it is built
    (:meth:`ebmcore.KernelBackend.add`), not found out by a wrong result. ``reference``: a pure-torch
    implementation, called as the op is; a chain's reference takes the energy's gradient (``gradient(x)``, or
    ``energy_and_gradient(x)``) in place of the energy's arguments, and the backend's noise stream (``normal=``,
    ``uniform=``: :data:`Normals`, :data:`Uniforms`) as keywords, since each backend documents its own stream."""

    name: str
    positional: tuple[str, ...]
    keywords: tuple[str, ...] = ()
    returns: str = ""
    reference: Optional[Callable[..., Any]] = None

    def matches(self, op: str) -> bool:
        """Whether ``op`` is this op (for ``<energy>_...``: any analytic energy's)."""
        if self.name.startswith("<energy>"):
            suffix = self.name[len("<energy>") :]
            return op.endswith(suffix) and len(op) > len(suffix)
        return op == self.name

    @property
    def signature(self) -> str:
        """For people: ``(x: (n, d), *energy_args, *, n_steps: int, ...) -> x': (n, d)``."""
        parts = [*self.positional, *(("*", *self.keywords) if self.keywords else ())]
        if self.keywords and any(p.startswith("*") for p in self.positional):
            parts.remove("*")  # after *args the rest is keyword-only already
        return f"({', '.join(parts)}) -> {self.returns}"

    def conformance(self, fn: Callable[..., Any]) -> Optional[str]:
        """Why ``fn`` cannot be called as the op is called (None if it can): ``fn(x, <positional args>, **keywords)``.
        The op's positional parameters come first, by name; an ``<energy>`` op's parameters then follow positionally
        (``*args``, or parameters of their own names), so its keywords must be keyword-only; another op's keywords may
        also be positional-or-keyword parameters. Extra parameters with defaults are allowed (a kernel's own options,
        such as Triton's ``precision``); callables without a Python signature are not checked."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        kind = inspect.Parameter
        positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
        rest = any(p.kind is kind.VAR_POSITIONAL for p in params)
        any_keyword = any(p.kind is kind.VAR_KEYWORD for p in params)
        want = [_name(p) for p in self.positional if not p.startswith("*")]
        want_rest = any(p.startswith("*") for p in self.positional)
        keywords = [_name(k) for k in self.keywords]
        problems = []
        head, tail = [p.name for p in positional[: len(want)]], positional[len(want) :]
        if head != want:
            problems.append(f"positional parameters ({', '.join(p.name for p in positional)}), the op's are ({', '.join(want)})")
        if want_rest:  # the energy's arguments: *args, or parameters of their own; no keyword may sit among them
            if not rest and not tail:
                problems.append("does not take the energy's arguments (as *args or parameters of their own)")
            clash = [p.name for p in tail if p.name in keywords]
            if clash:
                problems.append(f"takes {', '.join(clash)} positionally, where the energy's arguments go: make them keyword-only")
        by_keyword = {
            p.name: p
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


def _name(parameter: str) -> str:
    return parameter.split(":", 1)[0].strip().lstrip("*")


_CHAIN = ("n_steps: int", "step_size: float | (n,)", "noise_scale: float | (n,)", "seed: int", "offset: int")
FUSED_OPS: dict[str, FusedOp] = {
    op.name: op
    for op in (
        FusedOp("<energy>_langevin_chain", ("x: (n, d)", "*energy_args"), _CHAIN, "x': (n, d)", langevin_chain_reference),
        FusedOp(
            "<energy>_hmc_chain",
            ("x: (n, d)", "*energy_args"),
            (
                "n_steps: int",
                "step_size: float | (n,)",
                "n_leapfrog_steps: int",
                "inverse_temperature: float",
                "seed: int",
                "offset: int",
            ),
            "(x': (n, d), accepted: (n,), divergent: (n,))",
            hmc_chain_reference,
        ),
        FusedOp(
            "<energy>_nuts_chain",
            ("x: (n, d)", "*energy_args"),
            (
                "n_steps: int",
                "step_size: float | (n,)",
                "max_tree_depth: int",
                "inverse_temperature: float",
                "seed: int",
                "offset: int",
            ),
            "(x': (n, d), acceptance: (n,), divergent: (n,), n_leapfrog: (n,), tree_depth: (n,))",
        ),
        FusedOp(
            "langevin_step_philox",
            ("x: (n, d)", "grad: (n, d)", "step_size: float | (n,)", "noise_scale: float | (n,)", "seed: int", "offset: int"),
            (),
            "x': (n, d)",
            langevin_step_reference,
        ),
        FusedOp(
            "feedforward_langevin_chain",
            ("x: (n, d)", "network: ebmcore.energies.program.FeedForward"),
            _CHAIN,
            "x': (n, d)",
            langevin_chain_reference,
        ),
        FusedOp(
            "conv_langevin_chain",
            ("x: (n, C, H, W)", "stack: ebmcore.energies.program.ConvStack"),
            _CHAIN,
            "x': (n, C, H, W)",
            langevin_chain_reference,
        ),
    )
}
"""The fused chains, defined here once (:class:`FusedOp`), with their ``torch`` references given the backend's noise
(NUTS has none: its kernels are held to the per-step sampler's law): they run many steps per launch, the noise drawn
inside the kernel from a counter-based stream keyed by ``seed`` at steps ``offset, offset + 1, ...`` (``ebm-cuda``
defines it: Philox4x32-10, ``ebm_cuda.reference``); ``<energy>`` is an
:class:`~ebmcore.energies.AnalyticEnergy`'s ``op`` and ``energy_args`` its ``kernel_args()``.
``feedforward_langevin_chain`` and ``conv_langevin_chain`` run the ULA chains of an energy whose program
(:mod:`ebmcore.energies.program`) is a ``FeedForward`` network or a ``ConvStack``. Samplers call them when a backend
provides them (``fused=`` of the samplers) and otherwise run their torch path, so forcing ``EBM_BACKEND=torch``
selects the reference path. Plugins define the ops of their own components as :class:`FusedOp` too, where they use
them (the losses': ``ebm_losses.ops.LOSS_OPS``), and hold the kernels they resolve to them (:func:`fused_op`)."""


def fused_op(op: str, definitions: Any = None) -> Optional[FusedOp]:
    """The definition of ``op`` among ``definitions`` (default :data:`FUSED_OPS`), or None: the op of that exact
    name, else an ``<energy>_...`` op it is an instance of (``feedforward_langevin_chain`` is its own op, not the
    ``<energy>_langevin_chain`` of an energy called ``feedforward``)."""
    definitions = FUSED_OPS if definitions is None else definitions
    if op in definitions:
        return definitions[op]
    return next((d for d in definitions.values() if d.matches(op)), None)
