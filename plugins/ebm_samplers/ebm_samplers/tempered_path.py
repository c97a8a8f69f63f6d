"""The geometric path from a normalised base density ``q`` to ``p ∝ exp(−E)``:
``π_β(x) ∝ q(x)^(1−β)·exp(−β·E(x))`` for ``0 ≤ β ≤ 1``, as an energy ``E_β = β·E − (1−β)·log q``.

A base is any object with ``sample(n, generator) -> (n, *event_shape)`` and a normalised
``log_prob(x) -> (n,)`` (a ``torch.distributions`` distribution over the event qualifies, wrapped or not);
``log_prob_and_gradient(x)``, where it has one, saves autograd. :class:`GaussianBase` is ``N(loc, diag(scale²))``,
the base of :mod:`ebm_samplers.ais`, normalised here so that ``log Z_0 = 0`` and the path's ``log Z_1`` is
``log ∫ exp(−E)``.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.energies.binding import bind_energy
from ebmcore.errors import InputError

__all__ = ["Base", "GaussianBase", "WhitenedBase", "TemperedEnergy", "base_log_prob_and_gradient"]


@runtime_checkable
class Base(Protocol):
    """A normalised density to start from: ``sample(n, generator) -> (n, *event_shape)``, ``log_prob(x) -> (n,)``."""

    def sample(self, n: int, generator: Optional[torch.Generator]) -> Tensor: ...

    def log_prob(self, x: Tensor) -> Tensor: ...


class GaussianBase:
    """``N(loc, diag(scale²))`` over ``loc``'s shape (the event shape): ``loc`` and ``scale`` are tensors of the same
    shape (``scale > 0``), in the dtype and on the device the particles will have."""

    def __init__(self, loc: Tensor, scale: Tensor) -> None:
        if not isinstance(loc, Tensor) or not isinstance(scale, Tensor) or loc.shape != scale.shape:
            raise InputError(
                "GaussianBase(loc, scale) takes two tensors of the event shape, e.g. "
                "GaussianBase(torch.zeros(2), 3 * torch.ones(2))."
            )
        if not bool(torch.isfinite(loc).all()) or not bool((torch.isfinite(scale) & (scale > 0)).all()):
            raise InputError("GaussianBase: loc must be finite and scale finite and positive.")
        self.loc, self.scale = loc, scale.to(loc)
        self._inv_var = self.scale.pow(-2)
        self._log_norm = float(self.scale.double().log().sum()) + 0.5 * loc.numel() * math.log(2 * math.pi)

    @classmethod
    def like(cls, loc: Any, scale: Any, event_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> "GaussianBase":
        """From numbers or tensors broadcasting to ``event_shape`` (as :func:`ebm_samplers.ais.estimate_log_z` takes them)."""
        as_event = lambda v: torch.as_tensor(v, dtype=dtype, device=device).expand(event_shape).contiguous()
        return cls(as_event(loc), as_event(scale))

    @property
    def event_shape(self) -> tuple[int, ...]:
        return tuple(self.loc.shape)

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """``(n, *event_shape)`` draws."""
        noise = torch.randn((n, *self.loc.shape), generator=generator, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.scale * noise

    def log_prob_and_gradient(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(log q(x): (n,), ∇ log q(x)`` like ``x``)."""
        diff = x - self.loc
        z = diff * self._inv_var
        return -0.5 * (z * diff).flatten(1).sum(1) - self._log_norm, -z

    def log_prob(self, x: Tensor) -> Tensor:
        """``log q(x): (n,)`` for ``x: (n, *event_shape)``."""
        return self.log_prob_and_gradient(x)[0]


class WhitenedBase:
    """A base given in the whitened coordinates ``z = L⁻¹(x − loc)`` and mapped to ``x: (n, *event_shape)``:
    ``N(loc, LLᵀ)``, or an energy's exact base in ``z`` (``exact``: an :class:`ebm_samplers.ais.ExactBase`, such as a
    fitted mixture), so that SMC starts where AIS and importance sampling do. ``loc: (d,)``, ``scale_tril: (d, d)``
    lower triangular; ``log q(x) = −E₀(z) − log Z₀ − Σ log Lᵢᵢ``."""

    def __init__(self, loc: Tensor, scale_tril: Tensor, event_shape: tuple[int, ...], exact: Any = None) -> None:
        d = math.prod(event_shape)
        if loc.shape != (d,) or scale_tril.shape != (d, d):
            raise InputError(
                f"WhitenedBase: loc must be ({d},) and scale_tril ({d}, {d}), got {tuple(loc.shape)} and {tuple(scale_tril.shape)}."
            )
        self.loc, self.tril, self.event_shape, self.exact = loc, scale_tril, tuple(event_shape), exact
        self._log_det = float(scale_tril.double().diagonal().log().sum())

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """``(n, *event_shape)`` draws."""
        d = self.loc.numel()
        if self.exact is None:
            z = torch.randn(n, d, generator=generator, dtype=self.loc.dtype, device=self.loc.device)
        else:
            z = self.exact.sample(n, generator).to(self.loc)
        return (self.loc + z @ self.tril.T).reshape(n, *self.event_shape)

    def log_prob(self, x: Tensor) -> Tensor:
        """``log q(x): (n,)``."""
        flat = (x.flatten(1) - self.loc.to(x)).T
        z = torch.linalg.solve_triangular(self.tril.to(x), flat, upper=False).T
        if self.exact is None:
            return -0.5 * z.square().sum(1) - 0.5 * z.shape[1] * math.log(2 * math.pi) - self._log_det
        return -self.exact.energy(z) - self.exact.log_z - self._log_det


def base_log_prob_and_gradient(base: Base, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(log q(x), ∇ log q(x))``: the base's own ``log_prob_and_gradient`` where it has one, else autograd."""
    own = getattr(base, "log_prob_and_gradient", None)
    if own is not None:
        return own(x)
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        lp = base.log_prob(xg)
        (grad,) = torch.autograd.grad(lp.sum(), xg)
    return lp.detach(), grad


class TemperedEnergy(EnergyModel):
    """``E_β(x) = β·E(x) − (1−β)·log q(x)``, the energy of ``π_β ∝ q^(1−β)·exp(−β·E)``; ``beta`` (a float in
    ``[0, 1]``) may be changed between uses of the bound functions, which read it at each call. A view of ``energy``
    (it does not own its parameters)."""

    def __init__(self, energy: EnergyModel, base: Base, beta: float = 0.0) -> None:
        super().__init__()
        object.__setattr__(self, "_energy", energy)  # not a submodule: the view owns no parameters
        self.base, self.beta = base, float(beta)
        self.event_shape = energy.event_shape

    def _reference_tensor(self) -> Tensor | None:
        return self._energy._reference_tensor()

    def compute_energy(self, x: Tensor) -> Tensor:
        b = self.beta
        return b * self._energy.compute_energy(x) - (1 - b) * self.base.log_prob(x)

    def compute_energy_and_gradient(self, x: Tensor, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        e, g = self._energy.compute_energy_and_gradient(x, create_graph)
        lq, glq = base_log_prob_and_gradient(self.base, x)
        b = self.beta
        return b * e - (1 - b) * lq, b * g - (1 - b) * glq

    def bind(self, like: Tensor) -> EnergyFunctions:
        """The tempered callables over the energy's own bound ones (its kernels and closed forms kept)."""
        fns = bind_energy(self._energy, like)

        def energy(x: Tensor) -> Tensor:
            b = self.beta
            return b * fns.energy(x) - (1 - b) * self.base.log_prob(x)

        def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
            e, g = fns.energy_and_gradient(x)
            lq, glq = base_log_prob_and_gradient(self.base, x)
            b = self.beta
            return b * e - (1 - b) * lq, b * g - (1 - b) * glq

        return EnergyFunctions(energy, lambda x: energy_and_gradient(x)[1], energy_and_gradient, fns.path)
