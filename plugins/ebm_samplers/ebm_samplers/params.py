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
from typing import Any, Callable, Union

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["ChainScalar", "event_size", "per_chain", "positive", "optional", "whole", "in_range", "for_chains",
           "checked", "with_fields", "accepted_fields", "InverseMass", "IDENTITY", "as_inverse_mass"]

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
            raise InputError(f"{name} must be a number or a tensor of shape (n_chains,) = ({x.shape[0]},), got {tuple(value.shape)}.")
        value = value.to(device=x.device, dtype=x.dtype)
        inside = bool(((value >= finfo.tiny) & (value <= finfo.max)).all())
    else:
        inside = finfo.tiny <= value <= finfo.max
    if not inside:
        raise InputError(f"{name} must lie in [{finfo.tiny:.3g}, {finfo.max:.3g}] for {x.dtype} states, got {value!r}; "
                         "it (or its inverse) would overflow or vanish in the step.")
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
    """An HMC inverse mass matrix ``M⁻¹``, with what a step needs precomputed.

    ``kind`` is ``"identity"``, ``"diagonal"`` (``values`` of shape ``event_shape`` or
    ``(n_chains, *event_shape)``) or ``"dense"`` (``values: (d, d)``, 1-d events only).
    """

    kind: str
    values: Tensor | None = None
    mass_sqrt: Tensor | None = None  # diagonal: √M = 1/√M⁻¹; dense: Cholesky factor of M

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
            raise InputError(f"inv_mass (dense) must be a symmetric (d, d) matrix, got shape {tuple(matrix.shape)}.")
        chol, info = torch.linalg.cholesky_ex(torch.linalg.inv(matrix.double()))
        if int(info) != 0:
            raise InputError("inv_mass (dense) must be positive definite.")
        return cls("dense", matrix, chol.to(matrix.dtype))

    def momentum(self, noise: Tensor) -> Tensor:
        """``p ~ N(0, M)`` from standard normal ``noise``."""
        if self.kind == "identity":
            return noise
        if self.kind == "diagonal":
            return noise * self.mass_sqrt
        return noise @ self.mass_sqrt.T

    def velocity(self, p: Tensor) -> Tensor:
        """``M⁻¹ p``."""
        if self.kind == "identity":
            return p
        if self.kind == "diagonal":
            return p * self.values
        return p @ self.values

    def kinetic(self, p: Tensor) -> Tensor:
        """``½ pᵀ M⁻¹ p`` per chain: ``(n,)``."""
        flat = p.flatten(1)
        return torch.linalg.vecdot(flat, self.velocity(p).flatten(1)).mul_(0.5)


IDENTITY = InverseMass("identity")


def as_inverse_mass(value: Any, x: Tensor) -> InverseMass:
    """Check ``inv_mass`` (None, diagonal ``event_shape`` / ``(n, *event_shape)``, or dense ``(d, d)``) for the states ``x``."""
    if value is None:
        return IDENTITY
    if isinstance(value, InverseMass):
        return value
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
