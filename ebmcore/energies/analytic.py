"""Base class of closed-form energies whose energy and gradient run through the kernel dispatch."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from torch import Tensor

from ebmcore.energies.base import EnergyFunctions, EnergyModel
from ebmcore.energies.params import Param
from ebmcore.energies.program import Analytic, Program
from ebmcore.errors import InputError
from ebmcore.kernels.resolve import resolve_kernel
from ebmcore.validation import check_positive_int

__all__ = ["AnalyticEnergy"]


class AnalyticEnergy(EnergyModel):
    """An energy with ops ``<op>_energy`` and ``<op>_gradient`` in the kernel registry.

    A subclass declares, once:

    - ``op``: the op name;
    - ``params``: its parameters, a tuple of :class:`~ebmcore.energies.params.Param` in the order
      of the ops' arguments after ``x`` (``scalar``, ``vector``, ``matrix``, ``tensor``);
    - ``reference_energy(x, *params) -> (n,)`` and ``reference_gradient(x, *params) -> (n, d)``
      (static methods in plain PyTorch): the ``torch`` backend's kernels for its ops;
    - optionally ``min_dim`` (the smallest ``d``) and ``sample_scale`` (the standard deviation
      of the sample inputs ``x`` for contract checks).

    Its ``__init__`` calls ``super().__init__(dim, backend)`` and then
    :meth:`set_parameters` with one value per declared parameter. :meth:`kernel_args` is then
    the parameters in declared order. ``backend`` (optional) pins this energy's kernels to a
    backend, strictly (see :mod:`ebmcore.kernels.resolve`); by default the fastest kernel that
    can run is chosen per device and dtype.
    """

    op: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    reference_energy: ClassVar[Callable[..., Tensor] | None] = None
    reference_gradient: ClassVar[Callable[..., Tensor] | None] = None
    min_dim: ClassVar[int] = 1
    sample_scale: ClassVar[float] = 1.0

    def __init__(self, dim: int, backend: str | None = None) -> None:
        super().__init__()
        check_positive_int(dim, f"{type(self).__name__}: dim")
        if dim < self.min_dim:
            raise InputError(f"{type(self).__name__} needs dim >= {self.min_dim}, got {dim}.")
        self.dim = dim
        self.event_shape = (dim,)
        self.backend = backend

    def set_parameters(self, **values: Any) -> None:
        """Check and store one value per declared parameter: a scalar as a float attribute, a tensor as
        a buffer (it then fixes the dtype and device inputs must have). Shapes are checked against the
        declaration with ``d = dim``; non-finite values are errors."""
        names = [p.name for p in self.params]
        if sorted(values) != sorted(names):
            missing = [n for n in names if n not in values]
            extra = [n for n in values if n not in names]
            raise TypeError(
                f"{type(self).__name__}.set_parameters takes exactly the declared parameters {names}; "
                f"missing {missing}, undeclared {extra}."
            )
        sizes = {"d": self.dim}
        for p in self.params:
            value = p.check(values[p.name], type(self).__name__, sizes)
            if isinstance(value, Tensor):
                self.register_buffer(p.name, value)
            else:
                setattr(self, p.name, value)

    def kernel_args(self) -> tuple[Any, ...]:
        """The op's arguments after ``x``: the declared ``params``, in order (floats and tensors)."""
        return tuple(getattr(self, p.name) for p in self.params)

    def program(self) -> Program:
        """:class:`~ebmcore.energies.program.Analytic`: the op and :meth:`kernel_args`."""
        return Analytic(self.op, self.kernel_args())

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
        program = self.program()
        args = program.args
        return EnergyFunctions(
            lambda x: energy_fn(x, *args),
            lambda x: gradient_fn(x, *args),
            lambda x: (energy_fn(x, *args), gradient_fn(x, *args)),
            program=program,
        )

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", backend={self.backend!r}" if self.backend else "")
