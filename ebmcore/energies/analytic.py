"""Base class of closed-form energies whose energy and gradient run through the kernel dispatch."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from ebmcore.energies.base import EnergyFunctions, EnergyModel
from ebmcore.kernels.resolve import resolve_kernel

__all__ = ["AnalyticEnergy"]


class AnalyticEnergy(EnergyModel):
    """An energy with ops ``<op>_energy`` and ``<op>_gradient`` in the kernel registry.

    ``backend`` (optional) pins this energy's kernels to a backend, strictly
    (see :mod:`ebmcore.kernels.resolve`); by default the fastest kernel that
    can run is chosen per device and dtype.
    """

    op: ClassVar[str]

    def __init__(self, dim: int, backend: str | None = None) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            from ebmcore.errors import InputError

            raise InputError(f"{type(self).__name__}: dim must be a positive integer, got {dim!r}.")
        self.dim = dim
        self.event_shape = (dim,)
        self.backend = backend

    def kernel_args(self) -> tuple[Any, ...]:
        """The op's arguments after ``x`` (parameters of this energy)."""
        raise NotImplementedError

    def compute_energy(self, x: Tensor) -> Tensor:
        """Unchecked ``E(x)``: ``x: (n, dim)`` -> ``(n,)``, through the ``<op>_energy`` kernel for ``x``'s device and dtype."""
        return resolve_kernel(f"{self.op}_energy", x.device, x.dtype, self.backend).fn(x, *self.kernel_args())

    def compute_gradient(self, x: Tensor, create_graph: bool = False) -> Tensor:
        """Unchecked ``∇ₓE(x)``: ``x: (n, dim)`` -> ``(n, dim)``, through the ``<op>_gradient`` kernel (closed form,
        not autograd); ``create_graph`` is not passed to the kernel."""
        return resolve_kernel(f"{self.op}_gradient", x.device, x.dtype, self.backend).fn(x, *self.kernel_args())

    def bind(self, like: Tensor) -> EnergyFunctions:
        """Resolve both kernels once for ``like``'s device and dtype; the callables close over the parameters."""
        energy_fn = resolve_kernel(f"{self.op}_energy", like.device, like.dtype, self.backend).fn
        gradient_fn = resolve_kernel(f"{self.op}_gradient", like.device, like.dtype, self.backend).fn
        args = self.kernel_args()
        return EnergyFunctions(
            lambda x: energy_fn(x, *args),
            lambda x: gradient_fn(x, *args),
            lambda x: (energy_fn(x, *args), gradient_fn(x, *args)),
        )

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", backend={self.backend!r}" if self.backend else "")
