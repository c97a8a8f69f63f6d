"""Symplectic splitting integrators for Hamiltonian dynamics, built from palindromic coefficient lists.

A scheme is kicks ``b₀, …, b_k`` and drifts ``a₀, …, a_{k−1}`` (``Σb = Σa = 1``): one step of size
``h`` is ``kick(b₀h) drift(a₀h) kick(b₁h) … drift(a_{k−1}h) kick(b_k h)`` where
``kick(c): p ← p − c ∇E(x)/T`` and ``drift(c): x ← x + c M⁻¹p``. Consecutive steps merge the last
kick of one with the first kick of the next, so a trajectory of ``L`` steps costs ``k·L`` gradient
evaluations after the one carried in the sampler's state: ``L + 1`` in all for leapfrog, not ``2L``.
"""

from __future__ import annotations


from torch import Tensor

from ebmcore import EnergyFunctions, Integrator
from ebmcore.kernels.torch_backend import add_scaled_
from ebm_samplers.params import ChainScalar, InverseMass

__all__ = ["SplittingIntegrator", "Leapfrog", "McLachlan", "Yoshida"]


def _kick(p: Tensor, grad: Tensor, scale: ChainScalar) -> None:
    """``p ← p − scale·grad`` in place."""
    if isinstance(scale, float):
        add_scaled_(p, grad, -scale)
    else:
        p.addcmul_(grad, scale, value=-1.0)


def _drift(x: Tensor, p: Tensor, scale: ChainScalar, inv_mass: InverseMass) -> None:
    """``x ← x + scale·M⁻¹p`` in place."""
    v = inv_mass.velocity(p)
    if isinstance(scale, float):
        add_scaled_(x, v, scale)
    else:
        x.addcmul_(v, scale)


class SplittingIntegrator(Integrator):
    """A palindromic splitting scheme; subclasses set ``kicks``, ``drifts`` and ``order``."""

    kind = "hamiltonian"
    symplectic = True
    kicks: tuple[float, ...]
    drifts: tuple[float, ...]

    @property
    def gradient_evaluations_per_step(self) -> int:
        return len(self.drifts)

    def integrate(
        self,
        x: Tensor,
        p: Tensor,
        grad: Tensor,
        fns: EnergyFunctions,
        step_size: ChainScalar,
        n_steps: int,
        inv_mass: InverseMass,
        inv_temperature: ChainScalar = 1.0,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Advance ``(x, p)`` by ``n_steps`` steps **in place**; ``grad = ∇E(x)`` on entry.

        Returns ``(x, p, E(x), ∇E(x))`` at the end; the last force evaluation also gives the energy.
        ``step_size`` and ``inv_temperature`` are floats or ``(n, 1, ...)`` tensors.
        """
        if n_steps == 0:
            energy, grad = fns.energy_and_gradient(x)
            return x, p, energy, grad
        h = step_size
        force = h * inv_temperature  # kick scale per unit coefficient
        kicks, drifts = self.kicks, self.drifts
        last_stage = len(drifts) - 1
        energy = None
        _kick(p, grad, kicks[0] * force)
        for step in range(n_steps):
            final_step = step == n_steps - 1
            for j, a in enumerate(drifts):
                _drift(x, p, a * h, inv_mass)
                if final_step and j == last_stage:
                    energy, grad = fns.energy_and_gradient(x)
                    _kick(p, grad, kicks[j + 1] * force)
                else:
                    grad = fns.gradient(x)
                    b = kicks[j + 1] + (kicks[0] if j == last_stage else 0.0)
                    _kick(p, grad, b * force)
        return x, p, energy, grad


class Leapfrog(SplittingIntegrator):
    """Velocity Verlet: ``½ kick, drift, ½ kick``; order 2, one gradient per step."""

    name = "leapfrog"
    order = 2
    kicks = (0.5, 0.5)
    drifts = (1.0,)


_B1 = 0.1931833275037836  # Blanes, Casas & Sanz-Serna (2014): minimum-error two-stage scheme


class McLachlan(SplittingIntegrator):
    """McLachlan's two-stage scheme (``b₁ ≈ 0.1932``): order 2 with a ~10× smaller error constant
    than leapfrog per gradient evaluation pair; two gradients per step."""

    name = "mclachlan"
    order = 2
    kicks = (_B1, 1.0 - 2.0 * _B1, _B1)
    drifts = (0.5, 0.5)


_W1 = 1.0 / (2.0 - 2.0 ** (1.0 / 3.0))
_W0 = -(2.0 ** (1.0 / 3.0)) * _W1


class Yoshida(SplittingIntegrator):
    """Yoshida's fourth-order triple-jump composition of leapfrog; three gradients per step."""

    name = "yoshida"
    order = 4
    kicks = (_W1 / 2, (_W0 + _W1) / 2, (_W0 + _W1) / 2, _W1 / 2)
    drifts = (_W1, _W0, _W1)
