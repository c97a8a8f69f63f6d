"""Turning an integrator given by name or instance into a checked instance."""

from __future__ import annotations

from typing import Any

from ebmcore import Integrator, registry
from ebmcore.errors import InputError
from ebmcore.integrator import IntegratorKind

__all__ = ["resolve_integrator"]


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
