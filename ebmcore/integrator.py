"""The integrator base class: numerical schemes for SDEs, ODEs and Hamiltonian dynamics, with declared capabilities."""

from __future__ import annotations

from typing import ClassVar, Literal

from ebmcore.errors import InputError

__all__ = ["Integrator", "IntegratorKind"]

IntegratorKind = Literal["sde", "ode", "hamiltonian"]


class Integrator:
    """A scheme that advances a state by one step; the samplers define the call signature per ``kind``.

    Capabilities are class attributes, read by samplers and by the resolver
    of names, so that a mismatch fails before any work with an exact message
    (torchsde style).
    """

    name: ClassVar[str] = "integrator"
    kind: ClassVar[IntegratorKind]
    order: ClassVar[float]
    adaptive: ClassVar[bool] = False
    symplectic: ClassVar[bool] = False

    def require(self, *, kind: IntegratorKind, symplectic: bool = False, user: str = "this sampler") -> None:
        """Raise :class:`InputError` unless this integrator has ``kind`` (and is symplectic if asked)."""
        if self.kind != kind:
            raise InputError(f"integrator '{self.name}' integrates {self.kind} dynamics but {user} needs a {kind} integrator.")
        if symplectic and not self.symplectic:
            raise InputError(f"integrator '{self.name}' is not symplectic, which {user} needs.")
