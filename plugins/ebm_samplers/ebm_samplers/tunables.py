"""Tunables shared by the samplers: per-chain scalars, inverse mass matrices, defaults from the dimension.

The functional ``step`` functions trust their tunables (no checks, no sync);
the object API validates them once per ``sample`` call with these helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["ChainScalar", "per_chain", "as_chain_scalar", "InverseMass", "as_inverse_mass", "event_size"]

ChainScalar = Union[float, Tensor]
"""A tunable that is one number for all chains (``float``) or one per chain (``Tensor: (n_chains,)``)."""


def event_size(x: Tensor) -> int:
    """``d``: the number of elements of one chain's state."""
    return math.prod(x.shape[1:])


def per_chain(value: ChainScalar, x: Tensor) -> ChainScalar:
    """``value`` shaped to broadcast against ``x: (n, *event_shape)``: floats stay floats, ``(n,)`` becomes ``(n, 1, ...)``."""
    if isinstance(value, Tensor) and value.dim() == 1:
        return value.view(-1, *([1] * (x.dim() - 1)))
    return value


def as_chain_scalar(value: Any, x: Tensor, name: str) -> ChainScalar:
    """Validate a positive tunable given as a number, a 0-d tensor or one value per chain ``(n_chains,)``."""
    if isinstance(value, bool):
        raise InputError(f"{name} must be a positive number, got {value!r}.")
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{name} must be a finite positive number, got {value!r}.")
        return float(value)
    if isinstance(value, Tensor):
        if value.dim() == 0:
            return as_chain_scalar(float(value), x, name)
        if value.shape != (x.shape[0],):
            raise InputError(f"{name} must be a number or a tensor of shape (n_chains,) = ({x.shape[0]},), got {tuple(value.shape)}.")
        if not bool((torch.isfinite(value) & (value > 0)).all()):
            raise InputError(f"{name} must be finite and positive for every chain.")
        return value.to(device=x.device, dtype=x.dtype)
    raise InputError(f"{name} must be a positive number or a (n_chains,) tensor, got {type(value).__name__}.")


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
    """Validate ``inv_mass`` (None, diagonal ``event_shape`` / ``(n, *event_shape)``, or dense ``(d, d)``)."""
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
