"""The declared parameters of an analytic energy: one :class:`Param` per argument of its ops after ``x``.

An :class:`~ebmcore.energies.AnalyticEnergy` lists its parameters once, in ``params``::

    params = (vector("mean"), matrix("precision"))            # gaussian(x, mean: (d,), precision: (d, d))
    params = (scalar("barrier", sample=1.0, positive=True),)   # double_well(x, barrier: float)

Everything else is derived from that table: ``kernel_args()``, the checks of
``set_parameters``, the op signatures and sample inputs of :mod:`ebmcore.kernels.ops`
(what ``ebmcore.testing.check_kernel`` compares backends on), and, in ``ebm-cuda``,
which parameter goes to which slot of the kernels' C description.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore.validation import check_positive

__all__ = ["Param", "scalar", "vector", "matrix", "tensor"]

Sample = Union[float, Callable[[int, torch.Generator], Tensor]]
"""A sample value for contract checks: a float (scalars), or ``make(d, generator) -> float64 tensor``."""


def _standard_normal(shape: tuple[str | int, ...]) -> Callable[[int, torch.Generator], Tensor]:
    def make(d: int, g: torch.Generator) -> Tensor:
        return torch.randn(*(d if s == "d" else s for s in shape), generator=g, dtype=torch.float64)

    return make


def _spd(d: int, g: torch.Generator) -> Tensor:
    """A random symmetric positive definite ``(d, d)`` matrix, ``A Aᵀ / d + I``."""
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a @ a.T / d + torch.eye(d, dtype=torch.float64)


@dataclass(frozen=True)
class Param:
    """One parameter of an analytic energy's ops, in argument order after ``x``.

    ``shape`` is ``()`` for a Python float, ``("d",)`` for a vector of the energy's dimension,
    ``("d", "d")`` for a matrix; other names (``("K", "d")``) are sizes the energy fixes itself,
    the same for every parameter that uses them. ``sample`` makes a value for contract checks:
    a float for a scalar, or ``make(d, generator) -> float64 tensor``. ``positive``: the value
    (every entry) must be strictly positive.
    """

    name: str
    shape: tuple[str | int, ...] = ()
    sample: Sample | None = None
    positive: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"parameter name {self.name!r} is not a Python identifier")
        if self.sample is None:
            raise ValueError(f"parameter {self.name!r}: give sample=, a value for contract checks")
        if not self.shape and not isinstance(self.sample, (int, float)):
            raise ValueError(f"scalar parameter {self.name!r}: sample= must be a number, got {self.sample!r}")

    @property
    def kind(self) -> str:
        """``"scalar"``, ``"vector"`` (``(d,)``), ``"matrix"`` (``(d, d)``) or ``"tensor"`` (any other shape)."""
        return {(): "scalar", ("d",): "vector", ("d", "d"): "matrix"}.get(tuple(self.shape), "tensor")

    @property
    def shape_text(self) -> str:
        """The declared shape as written in signatures: ``float``, ``(d,)``, ``(K, d)``."""
        if not self.shape:
            return "float"
        return "(" + ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "") + ")"

    def signature(self) -> str:
        """``name: float`` or ``name: (d, d)``."""
        return f"{self.name}: {self.shape_text}"

    def sample_value(self, d: int, generator: torch.Generator) -> float | Tensor:
        """A value for contract checks at dimension ``d`` (tensors in float64)."""
        if not self.shape:
            return float(self.sample)  # type: ignore[arg-type]
        return self.sample(d, generator)  # type: ignore[operator]

    def check(self, value: Any, owner: str, sizes: dict[str, int]) -> float | Tensor:
        """``value`` checked against the declaration: a finite float, or a floating tensor of the
        declared shape (sizes looked up in, and new ones recorded into, ``sizes``) with finite entries."""
        if not self.shape:
            if self.positive:
                return check_positive(value, f"{owner} {self.name}")
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise InputError(f"{owner}: {self.name} must be a number, got {value!r}.") from None
            if not math.isfinite(v):
                raise InputError(f"{owner}: {self.name} must be a finite number, got {value!r}.")
            return v
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise InputError(f"{owner}: {self.name} must be a floating-point tensor of shape {self.shape_text}, got {value!r}.")
        expected = tuple(sizes.get(s, None) if isinstance(s, str) else s for s in self.shape)
        got = tuple(value.shape)
        fits = len(got) == len(expected) and all(e is None or e == g for e, g in zip(expected, got))
        if not fits:
            concrete = ", ".join("?" if e is None else str(e) for e in expected)
            concrete = f"({concrete}{',' if len(expected) == 1 else ''})"
            raise InputError(f"{owner}: {self.name} must have shape {self.shape_text} = {concrete}, got {got}.")
        for s, g in zip(self.shape, got):
            if isinstance(s, str):
                sizes.setdefault(s, g)
        if not bool(torch.isfinite(value).all()):
            raise InputError(f"{owner}: {self.name} contains NaN or inf values.")
        if self.positive and not bool((value > 0).all()):
            raise InputError(f"{owner}: {self.name} must be positive.")
        return value


def scalar(name: str, sample: float, *, positive: bool = False, doc: str = "") -> Param:
    """A Python-float parameter (the kernels take it as a number); ``sample``: its value in contract checks."""
    return Param(name, (), sample, positive, doc)


def vector(name: str, sample: Sample | None = None, *, positive: bool = False, doc: str = "") -> Param:
    """A ``(d,)`` tensor parameter, held as a buffer; sampled from a standard normal unless ``sample`` is given."""
    return Param(name, ("d",), sample or _standard_normal(("d",)), positive, doc)


def matrix(name: str, sample: Sample | None = None, *, doc: str = "") -> Param:
    """A ``(d, d)`` tensor parameter, held as a buffer; sampled as a random symmetric positive definite
    matrix unless ``sample`` is given."""
    return Param(name, ("d", "d"), sample or _spd, False, doc)


def tensor(
    name: str, shape: tuple[str | int, ...], sample: Sample | None = None, *, positive: bool = False, doc: str = ""
) -> Param:
    """A tensor parameter of any declared ``shape`` (e.g. ``("K", "d")``), held as a buffer; sampled from a
    standard normal unless ``sample`` is given (required when ``shape`` names a size other than ``d``)."""
    if sample is None and any(isinstance(s, str) and s != "d" for s in shape):
        raise ValueError(
            f"parameter {name!r} of shape {tuple(shape)}: give sample=, a maker of values whose sizes other "
            "than d the energy fixes itself"
        )
    return Param(name, tuple(shape), sample or _standard_normal(tuple(shape)), positive, doc)
