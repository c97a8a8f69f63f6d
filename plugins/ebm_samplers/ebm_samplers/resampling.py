"""Resampling schemes for sequential Monte Carlo: ``scheme(weights, n, generator) -> indices``.

``weights: (*batch, m)`` are non-negative (normalised here, along the last dimension); the result ``(*batch, n)``
holds indices into the last dimension, drawn so that index ``i`` appears ``n·w_i`` times in expectation (unbiased).
Every scheme is a few batched tensor operations on the weights' device, with randomness from ``generator``:

- ``multinomial``: ``n`` independent draws (inverse CDF of sorted uniforms); the most variable.
- ``stratified``: one uniform in each of the ``n`` strata ``[j/n, (j+1)/n)``.
- ``systematic``: one uniform shifted through all strata (``(u + j)/n``); the least variable in practice, the default.
- ``residual``: ``⌊n·w_i⌋`` copies of each index, the remaining ``n − Σ⌊n·w_i⌋`` drawn multinomially from the residuals.

Stratified, systematic and residual have lower variance than multinomial (Douc, Cappé & Moulines 2005).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["Resampler", "multinomial", "stratified", "systematic", "residual", "SCHEMES", "get_scheme"]

Resampler = Callable[[Tensor, int, Optional[torch.Generator]], Tensor]
"""``scheme(weights: (*batch, m), n, generator) -> indices: (*batch, n)`` (``torch.long``)."""


def _cdf(weights: Tensor) -> Tensor:
    """The normalised cumulative sums ``(*batch, m)`` of ``weights``, in at least float64."""
    w = weights.to(torch.promote_types(weights.dtype, torch.float64))
    c = w.cumsum(-1)
    return c / c[..., -1:]


def _invert(cdf: Tensor, u: Tensor) -> Tensor:
    """Indices ``i`` with ``cdf[i−1] ≤ u < cdf[i]`` for ``u: (*batch, n)`` in ``[0, 1)`` (rounding kept in range)."""
    idx = torch.searchsorted(cdf.contiguous(), u.to(cdf.dtype).contiguous(), right=True)
    return idx.clamp_(max=cdf.shape[-1] - 1)


def _uniform(shape: tuple[int, ...], like: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=like.device)


def multinomial(weights: Tensor, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """``n`` independent draws from ``weights`` per batch row: ``(*batch, m) -> (*batch, n)``."""
    cdf = _cdf(weights)
    u, _ = _uniform((*cdf.shape[:-1], n), cdf, generator).sort(-1)
    return _invert(cdf, u)


def stratified(weights: Tensor, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """One draw per stratum, ``u_j = (j + U_j)/n`` with independent ``U_j``: ``(*batch, m) -> (*batch, n)``."""
    cdf = _cdf(weights)
    j = torch.arange(n, dtype=cdf.dtype, device=cdf.device)
    return _invert(cdf, (j + _uniform((*cdf.shape[:-1], n), cdf, generator)) / n)


def systematic(weights: Tensor, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """One uniform for all strata, ``u_j = (j + U)/n``: ``(*batch, m) -> (*batch, n)``."""
    cdf = _cdf(weights)
    j = torch.arange(n, dtype=cdf.dtype, device=cdf.device)
    return _invert(cdf, (j + _uniform((*cdf.shape[:-1], 1), cdf, generator)) / n)


def residual(weights: Tensor, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """``⌊n·w_i⌋`` copies of each ``i``, then multinomial draws from the residuals ``n·w_i − ⌊n·w_i⌋`` for the
    rest: ``(*batch, m) -> (*batch, n)``."""
    w = weights.to(torch.promote_types(weights.dtype, torch.float64))
    scaled = n * w / w.sum(-1, keepdim=True)
    copies = scaled.floor()
    kept = copies.cumsum(-1)  # (*batch, m): positions [kept[i-1], kept[i]) hold index i
    j = torch.arange(n, dtype=scaled.dtype, device=scaled.device).expand(*scaled.shape[:-1], n)
    deterministic = _invert(kept, j)  # the first i with kept[i] > j
    rest = scaled - copies
    rest = torch.where(rest.sum(-1, keepdim=True) > 0, rest, torch.ones_like(rest))  # no remainder: any row, unused
    drawn = _invert(_cdf(rest), _uniform(tuple(j.shape), rest, generator))  # unsorted: any n − Σ⌊n·w⌋ of them are iid
    return torch.where(j < kept[..., -1:], deterministic, drawn)


SCHEMES: dict[str, Resampler] = {
    "systematic": systematic,
    "stratified": stratified,
    "multinomial": multinomial,
    "residual": residual,
}
"""The schemes by name."""


def get_scheme(scheme: "str | Resampler") -> Resampler:
    """The scheme named ``scheme`` (one of :data:`SCHEMES`), or ``scheme`` itself if it is callable."""
    if callable(scheme):
        return scheme
    if scheme not in SCHEMES:
        raise InputError(
            f"resampling must be one of {', '.join(SCHEMES)} (or a function (weights, n, generator) -> indices), got {scheme!r}."
        )
    return SCHEMES[scheme]
