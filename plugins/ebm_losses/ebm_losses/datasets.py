"""2-d toy datasets, generated in code from a local ``torch.Generator`` (the global RNG is never touched).

Each function is ``make_<name>(n, *, generator=None, dtype=torch.float32) -> (n, 2)``; data are
scaled to lie roughly within ``[-4, 4]²``. ``make(name, n, ...)`` picks one by name.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = [
    "DATASETS",
    "make",
    "make_eight_gaussians",
    "make_two_moons",
    "make_swiss_roll",
    "make_circles",
    "make_checkerboard",
    "make_pinwheel",
]


def _generator(generator: torch.Generator | None) -> torch.Generator:
    return generator if generator is not None else torch.Generator().manual_seed(0)


def _check(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InputError(f"n must be a positive integer, got {n!r}.")


def make_eight_gaussians(
    n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32, radius: float = 2.0, std: float = 0.2
) -> Tensor:
    """Eight Gaussians of std ``std`` with centres equally spaced on a circle of ``radius``."""
    _check(n)
    g = _generator(generator)
    k = torch.randint(0, 8, (n,), generator=g)
    angle = k.double() * (2 * math.pi / 8)
    centres = radius * torch.stack([angle.cos(), angle.sin()], 1)
    return (centres + std * torch.randn(n, 2, generator=g, dtype=torch.float64)).to(dtype)


def make_two_moons(
    n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32, noise: float = 0.1
) -> Tensor:
    """Two interleaving half circles, centred and scaled by 2."""
    _check(n)
    g = _generator(generator)
    upper = torch.rand(n, generator=g, dtype=torch.float64) < 0.5
    t = torch.rand(n, generator=g, dtype=torch.float64) * math.pi
    x = torch.where(upper, t.cos(), 1 - t.cos())
    y = torch.where(upper, t.sin(), 0.5 - t.sin())
    points = torch.stack([x - 0.5, y - 0.25], 1) * 2
    return (points + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)).to(dtype)


def make_swiss_roll(
    n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32, noise: float = 0.1
) -> Tensor:
    """A 2-d Swiss roll (spiral ``t (cos t, sin t)`` for ``t ∈ [1.5π, 4.5π]``), scaled into ``[-3, 3]²``."""
    _check(n)
    g = _generator(generator)
    t = 1.5 * math.pi * (1 + 2 * torch.rand(n, generator=g, dtype=torch.float64))
    points = torch.stack([t * t.cos(), t * t.sin()], 1) / 5
    return (points + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)).to(dtype)


def make_circles(
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    radii: tuple[float, float] = (1.0, 2.5),
    noise: float = 0.08,
) -> Tensor:
    """Two concentric circles of radii ``radii``, half of the points on each."""
    _check(n)
    g = _generator(generator)
    r = torch.where(torch.rand(n, generator=g, dtype=torch.float64) < 0.5, radii[0], radii[1])
    angle = 2 * math.pi * torch.rand(n, generator=g, dtype=torch.float64)
    points = r[:, None] * torch.stack([angle.cos(), angle.sin()], 1)
    return (points + noise * torch.randn(n, 2, generator=g, dtype=torch.float64)).to(dtype)


def make_checkerboard(n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform on the 8 black squares of a 4×4 checkerboard over ``[-4, 4]²`` (cells of side 2;
    a cell ``(i, j) = (⌊x₁/2⌋, ⌊x₂/2⌋)`` is black when ``i + j`` is even)."""
    _check(n)
    g = _generator(generator)
    x1 = torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2
    x2 = torch.rand(n, generator=g, dtype=torch.float64) - torch.randint(0, 2, (n,), generator=g).double() * 2
    x2 = x2 + torch.floor(x1) % 2
    return (2 * torch.stack([x1, x2], 1)).to(dtype)


def make_pinwheel(
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    n_arms: int = 5,
    radial_std: float = 0.3,
    tangential_std: float = 0.1,
    rate: float = 0.25,
) -> Tensor:
    """Pinwheel (Johnson et al. 2016): ``n_arms`` Gaussian blobs bent into spiral arms."""
    _check(n)
    g = _generator(generator)
    arm = torch.randint(0, n_arms, (n,), generator=g).double()
    base = torch.randn(n, 2, generator=g, dtype=torch.float64) * torch.tensor([radial_std, tangential_std], dtype=torch.float64)
    base[:, 0] += 1.0
    angle = arm * (2 * math.pi / n_arms) + rate * base[:, 0].exp()
    rotation = torch.stack([torch.stack([angle.cos(), -angle.sin()], -1), torch.stack([angle.sin(), angle.cos()], -1)], -2)
    return (2 * torch.einsum("nij,nj->ni", rotation, base)).to(dtype)


DATASETS: dict[str, Callable[..., Tensor]] = {
    "eight_gaussians": make_eight_gaussians,
    "two_moons": make_two_moons,
    "swiss_roll": make_swiss_roll,
    "circles": make_circles,
    "checkerboard": make_checkerboard,
    "pinwheel": make_pinwheel,
}


def make(name: str, n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32, **params) -> Tensor:
    """``n`` points of the toy dataset ``name`` (one of :data:`DATASETS`): ``(n, 2)``."""
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}.")
    return DATASETS[name](n, generator=generator, dtype=dtype, **params)
