"""Integrators: Euler–Maruyama (overdamped Langevin SDE), symplectic splittings (leapfrog, McLachlan,
Yoshida) for Hamiltonian dynamics, and Heun / DOPRI5 for ODEs such as the probability flow."""

from typing import Any

from ebmcore import Integrator, registry
from ebmcore.errors import InputError
from ebmcore.integrator import IntegratorKind
from ebm_samplers.integrators.euler_maruyama import EulerMaruyama
from ebm_samplers.integrators.ode import DOPRI5, Heun, ODESolution
from ebm_samplers.integrators.splitting import Leapfrog, McLachlan, SplittingIntegrator, Yoshida

__all__ = [
    "EulerMaruyama",
    "SplittingIntegrator",
    "Leapfrog",
    "McLachlan",
    "Yoshida",
    "Heun",
    "DOPRI5",
    "ODESolution",
    "resolve_integrator",
]


def resolve_integrator(spec: Any, *, kind: IntegratorKind, symplectic: bool = False, user: str) -> Integrator:
    """``spec`` is a registered name or an :class:`ebmcore.Integrator`; it must have ``kind`` (and be symplectic if asked)."""
    if isinstance(spec, str):
        integrator = registry.get("integrator", spec)()
    elif isinstance(spec, Integrator):
        integrator = spec
    else:
        raise InputError(f"{user}: integrator must be a registered name or an ebmcore.Integrator, got {spec!r}.")
    integrator.require(kind=kind, symplectic=symplectic, user=user)
    return integrator
