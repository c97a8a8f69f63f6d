"""What the algorithms' ``Params`` are made of: per-chain scalars, inverse mass matrices, checks.

A ``Params`` is a frozen dataclass whose constructor checks each field on its own (a positive
number, an integer in range, ...); ``Params.resolve(x)`` then fills the defaults that depend on
the states (``d``, the number of elements per chain), checks shapes against ``x`` and moves
tensors to its device and dtype. A kernel's ``step`` trusts resolved params: no check, no sync.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = [
    "ChainScalar",
    "event_size",
    "per_chain",
    "positive",
    "optional",
    "whole",
    "in_range",
    "for_chains",
    "checked",
    "with_fields",
    "accepted_fields",
    "InverseMass",
    "IDENTITY",
    "as_inverse_mass",
]

ChainScalar = Union[float, Tensor]
"""A parameter that is one number for all chains (``float``) or one per chain (``Tensor: (n_chains,)``)."""


def event_size(x: Tensor) -> int:
    """``d``: the number of elements of one chain's state."""
    return math.prod(x.shape[1:])


def per_chain(value: ChainScalar, x: Tensor) -> ChainScalar:
    """``value`` shaped to broadcast against ``x: (n, *event_shape)``: floats stay floats, ``(n,)`` becomes ``(n, 1, ...)``."""
    if isinstance(value, Tensor) and value.dim() == 1:
        return value.view(-1, *([1] * (x.dim() - 1)))
    return value


def positive(value: Any, name: str) -> ChainScalar:
    """A finite positive number (``float``), or a 1-d tensor of them (one per chain, shape checked by :func:`for_chains`)."""
    if isinstance(value, bool):
        raise InputError(f"{name} must be a positive number, got {value!r}.")
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{name} must be a finite positive number, got {value!r}.")
        return float(value)
    if isinstance(value, Tensor):
        if value.dim() == 0:
            return positive(float(value), name)
        if value.dim() != 1:
            raise InputError(f"{name} must be a number or a tensor of shape (n_chains,), got shape {tuple(value.shape)}.")
        if not bool((torch.isfinite(value) & (value > 0)).all()):
            raise InputError(f"{name} must be finite and positive for every chain.")
        return value
    raise InputError(f"{name} must be a positive number or a (n_chains,) tensor, got {type(value).__name__}.")


def optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """``check``, letting None (the default for the states' dimension) through."""
    return lambda value, name: None if value is None else check(value, name)


def whole(low: int, high: int | None = None) -> Callable[[Any, str], int]:
    """A check for an integer in ``[low, high]`` (no upper bound without ``high``)."""
    what = f"an integer in [{low}, {high}]" if high else "a positive integer" if low == 1 else f"an integer >= {low}"

    def check(value: Any, name: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= (high or value):
            raise InputError(f"{name} must be {what}, got {value!r}.")
        return value

    return check


def in_range(low: float, high: float) -> Callable[[Any, str], float]:
    """A check for a number in ``[low, high)``."""

    def check(value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
            raise InputError(f"{name} must be in [{low:g}, {high:g}), got {value!r}.")
        return float(value)

    return check


def for_chains(value: ChainScalar, x: Tensor, name: str) -> ChainScalar:
    """A checked :func:`positive` value for the states ``x``: a float, or ``(n_chains,)`` on ``x``'s device and dtype;
    either within the range of ``x``'s dtype (where it and its inverse neither overflow nor vanish)."""
    finfo = torch.finfo(x.dtype)
    if isinstance(value, Tensor):
        if value.shape != (x.shape[0],):
            raise InputError(
                f"{name} must be a number or a tensor of shape (n_chains,) = ({x.shape[0]},), got {tuple(value.shape)}."
            )
        value = value.to(device=x.device, dtype=x.dtype)
        inside = bool(((value >= finfo.tiny) & (value <= finfo.max)).all())
    else:
        inside = finfo.tiny <= value <= finfo.max
    if not inside:
        raise InputError(
            f"{name} must lie in [{finfo.tiny:.3g}, {finfo.max:.3g}] for {x.dtype} states, got {value!r}; "
            "it (or its inverse) would overflow or vanish in the step."
        )
    return value


def with_fields(params: Any, **values: Any) -> Any:
    """A copy of frozen ``params`` with ``values`` put in unchecked: for values already checked (resolution, warm-up)."""
    new = copy.copy(params)
    new.__dict__.update(values)  # frozen: not through __setattr__
    return new


def checked(params: Any, **checks: Callable[[Any, str], Any]) -> None:
    """Run each field's check in a frozen dataclass's ``__post_init__`` and store the normalised value."""
    for name, check in checks.items():
        object.__setattr__(params, name, check(getattr(params, name), name))


def accepted_fields(cls: type) -> list[str]:
    """The field names of a ``Params`` class (for messages about unknown keywords)."""
    return [f.name for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class InverseMass:
    """An HMC metric: the inverse mass matrix ``M⁻¹``, with what a step needs precomputed.

    ``kind`` is ``"identity"``; ``"diagonal"`` (``values`` of shape ``event_shape`` or ``(n_chains, *event_shape)``);
    ``"dense"`` (``values: (d, d)``; ``mass_sqrt``, the Cholesky factor of ``M``); or ``"low_rank"``:
    ``M⁻¹ = diag(D) + U·diag(λ)·Uᵀ`` kept as ``D^½ (I + V·diag(μ)·Vᵀ) D^½`` with ``values = D: (d,)``,
    ``factors = V: (d, k)`` orthonormal and ``eigenvalues = μ: (k,)``, ``μ > −1``, so that every product
    costs ``O(d·k)``. A dense or low-rank metric acts on the flattened event (``d`` elements).
    """

    kind: str
    values: Tensor | None = None
    mass_sqrt: Tensor | None = None  # diagonal: √M = 1/√M⁻¹; dense: Cholesky factor of M; low-rank: D^(−½)
    factors: Tensor | None = None  # low-rank: V (d, k), orthonormal
    eigenvalues: Tensor | None = None  # low-rank: μ (k,)

    @classmethod
    def diagonal(cls, values: Tensor) -> "InverseMass":
        """A diagonal ``M⁻¹`` (shape ``event_shape`` or ``(n_chains, *event_shape)``), for when the shape alone is ambiguous."""
        if not bool((torch.isfinite(values) & (values > 0)).all()):
            raise InputError("inv_mass (diagonal) must be finite and positive.")
        return cls("diagonal", values, values.rsqrt())

    @classmethod
    def dense(cls, matrix: Tensor) -> "InverseMass":
        """A dense symmetric positive definite ``M⁻¹: (d, d)``."""
        if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or not torch.allclose(matrix, matrix.T, rtol=1e-5, atol=1e-8):
            raise InputError(
                f"inv_mass (dense) must be a symmetric (d, d) matrix, got shape {tuple(matrix.shape)}; "
                "symmetrise it with (m + m.T) / 2."
            )
        chol, info = torch.linalg.cholesky_ex(torch.linalg.inv(matrix.double()))
        if int(info) != 0 or not bool(torch.isfinite(matrix).all()):
            raise InputError(
                "inv_mass (dense) must be finite and positive definite (a covariance matrix); add a multiple "
                "of the identity to it, or let warmup(..., metric='dense') estimate it."
            )
        return cls("dense", matrix, chol.to(matrix.dtype))

    @classmethod
    def low_rank(cls, diagonal: Tensor, factors: Tensor, eigenvalues: Tensor) -> "InverseMass":
        """``M⁻¹ = diag(diagonal) + factors·diag(eigenvalues)·factorsᵀ`` from ``diagonal: (d,)`` (positive),
        ``factors: (d, k)`` and ``eigenvalues: (k,)``; positive definite. Put in canonical form once (``O(d·k²)``)."""
        d = diagonal.shape[0] if diagonal.dim() == 1 else -1
        if diagonal.dim() != 1 or factors.dim() != 2 or factors.shape[0] != d or eigenvalues.shape != (factors.shape[1],):
            raise InputError(
                f"inv_mass (low_rank) needs diagonal (d,), factors (d, k) and eigenvalues (k,), got shapes "
                f"{tuple(diagonal.shape)}, {tuple(factors.shape)} and {tuple(eigenvalues.shape)}."
            )
        if not all(bool(torch.isfinite(t).all()) for t in (diagonal, factors, eigenvalues)) or not bool((diagonal > 0).all()):
            raise InputError("inv_mass (low_rank) must be finite with a positive diagonal.")
        d64 = diagonal.double()
        q, r = torch.linalg.qr(factors.double() * d64.rsqrt()[:, None])  # D^(−½)U = QR
        mu, p = torch.linalg.eigh((r * eigenvalues.double()) @ r.T)  # R·diag(λ)·Rᵀ = P·diag(μ)·Pᵀ
        if not bool((mu > -1 + 1e-12).all()):
            raise InputError(
                "inv_mass (low_rank) must be positive definite: diagonal + factors·diag(eigenvalues)·factorsᵀ "
                "has a non-positive eigenvalue; use non-negative eigenvalues, or a larger diagonal."
            )
        dtype = diagonal.dtype
        return cls("low_rank", diagonal, d64.rsqrt().to(dtype), (q @ p).to(dtype), mu.to(dtype))

    def momentum(self, noise: Tensor) -> Tensor:
        """``p ~ N(0, M)`` from standard normal ``noise``: ``p = L·noise`` with ``L·Lᵀ = M``."""
        if self.kind == "identity":
            return noise
        if self.kind == "diagonal":
            return noise * self.mass_sqrt
        z = noise.flatten(1)
        if self.kind == "dense":
            return (z @ self.mass_sqrt.T).view_as(noise)
        # (I + V·diag(μ)·Vᵀ)^(−½) = I + V·diag((1 + μ)^(−½) − 1)·Vᵀ, since V is orthonormal
        root = self.eigenvalues.add(1).rsqrt_().sub_(1)
        return ((z @ self.factors).mul_(root) @ self.factors.T).add_(z).mul_(self.mass_sqrt).view_as(noise)

    def velocity(self, p: Tensor) -> Tensor:
        """``M⁻¹ p``."""
        if self.kind == "identity":
            return p
        if self.kind == "diagonal":
            return p * self.values
        flat = p.flatten(1)
        if self.kind == "dense":
            return (flat @ self.values).view_as(p)
        y = flat / self.mass_sqrt  # D^½ p
        return ((y @ self.factors).mul_(self.eigenvalues) @ self.factors.T).add_(y).div_(self.mass_sqrt).view_as(p)

    def kinetic(self, p: Tensor) -> Tensor:
        """``½ pᵀ M⁻¹ p`` per chain: ``(n,)``."""
        flat = p.flatten(1)
        return torch.linalg.vecdot(flat, self.velocity(p).flatten(1)).mul_(0.5)

    @property
    def metric(self) -> str:
        """The metric's name as ``warmup(..., metric=...)`` spells it: ``"identity"``, ``"diag"``, ``"dense"`` or ``"low_rank"``."""
        return {"diagonal": "diag"}.get(self.kind, self.kind)

    def tensors(self) -> dict[str, Tensor]:
        """The plain tensors that give this metric back through :func:`as_inverse_mass` (and that a run reports):
        ``{}`` (identity), ``{"diagonal"}``, ``{"dense": (d, d)}`` or ``{"diagonal": (d,), "factors": (d, k),
        "eigenvalues": (k,)}`` with ``M⁻¹ = diag(diagonal) + factors·diag(eigenvalues)·factorsᵀ``."""
        if self.kind == "identity":
            return {}
        if self.kind == "low_rank":
            return {"diagonal": self.values, "factors": self.factors / self.mass_sqrt[:, None], "eigenvalues": self.eigenvalues}
        return {self.kind: self.values}

    def matrix(self) -> Tensor:
        """``M⁻¹`` as a dense ``(d, d)`` matrix (not for a per-chain diagonal; ``O(d²)`` memory: for checks and reports)."""
        if self.kind == "dense":
            return self.values
        if self.kind == "low_rank":
            t = self.tensors()
            return torch.diag(t["diagonal"]) + (t["factors"] * t["eigenvalues"]) @ t["factors"].T
        if self.kind == "diagonal" and self.values.dim() == 1:
            return torch.diag(self.values)
        raise InputError(f"a {self.kind} inverse mass of this shape has no single (d, d) matrix.")


IDENTITY = InverseMass("identity")


def as_inverse_mass(value: Any, x: Tensor) -> InverseMass:
    """Check ``inv_mass`` for the states ``x``: None (identity), diagonal ``event_shape`` / ``(n, *event_shape)``, dense
    ``(d, d)``, an :class:`InverseMass`, or the mapping of :meth:`InverseMass.tensors` (``{"dense": ...}``, or
    ``{"diagonal", "factors", "eigenvalues"}`` for a low-rank metric; unambiguous whatever the number of chains)."""
    if value is None:
        return IDENTITY
    if isinstance(value, InverseMass):
        return value
    if isinstance(value, Mapping):
        return _from_tensors(value, x)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    v = value.to(device=x.device, dtype=x.dtype)
    event = tuple(x.shape[1:])
    d = event_size(x)
    diagonal_shape = tuple(v.shape) in {event, (x.shape[0], *event)}
    dense_shape = x.dim() == 2 and tuple(v.shape) == (d, d)
    if diagonal_shape and dense_shape:
        raise InputError(
            f"inv_mass of shape {tuple(v.shape)} is ambiguous with {x.shape[0]} chains of dimension {d}: pass "
            "ebm_samplers.InverseMass.dense(matrix) or ebm_samplers.InverseMass.diagonal(per_chain_values)."
        )
    if diagonal_shape:
        return InverseMass.diagonal(v)
    if dense_shape:
        return InverseMass.dense(v)
    raise InputError(
        f"inv_mass has shape {tuple(v.shape)}; expected the event shape {event} (diagonal), "
        f"({x.shape[0]}, *{event}) (diagonal per chain)" + (f", or ({d}, {d}) (dense)." if x.dim() == 2 else ".")
    )


_METRIC_KEYS = {
    frozenset({"diagonal"}): "diagonal",
    frozenset({"dense"}): "dense",
    frozenset({"diagonal", "factors", "eigenvalues"}): "low_rank",
}


def _from_tensors(value: Mapping[str, Any], x: Tensor) -> InverseMass:
    """The :class:`InverseMass` of a mapping of :meth:`InverseMass.tensors`, on ``x``'s device and dtype."""
    kind = _METRIC_KEYS.get(frozenset(value))
    if kind is None:
        raise InputError(
            f"inv_mass as a mapping has keys {sorted(value)}; expected {{'diagonal'}}, {{'dense'}} or "
            "{'diagonal', 'factors', 'eigenvalues'} (InverseMass.tensors())."
        )
    t = {k: torch.as_tensor(v).to(device=x.device, dtype=x.dtype) for k, v in value.items()}
    d = event_size(x)
    if kind == "diagonal":
        if tuple(t["diagonal"].shape) not in {tuple(x.shape[1:]), tuple(x.shape)}:
            raise InputError(
                f"inv_mass (diagonal) has shape {tuple(t['diagonal'].shape)}; expected the event shape "
                f"{tuple(x.shape[1:])} or one per chain {tuple(x.shape)}."
            )
        return InverseMass.diagonal(t["diagonal"])
    size = t["dense"].shape[0] if kind == "dense" else t["diagonal"].shape[0]
    if size != d:
        raise InputError(f"inv_mass ({kind}) is for d = {size} elements, the states have d = {d}.")
    return (
        InverseMass.dense(t["dense"]) if kind == "dense" else InverseMass.low_rank(t["diagonal"], t["factors"], t["eigenvalues"])
    )
