"""What a kernel backend declares: which ops it implements, on which devices, dtypes and GPUs."""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

__all__ = ["Kernel", "KernelBackend", "FLOAT_DTYPES"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Kernel:
    """One implementation of one op, with the capabilities it declares.

    ``fn`` has the op's signature (see :mod:`ebmcore.kernels.ops`).
    ``min_compute_capability`` (e.g. ``(8, 0)``) only applies on CUDA devices.
    Higher ``priority`` wins among kernels that can run; the ``torch``
    reference backend uses 0. ``max_event_size``: the most elements per chain
    the kernel takes (fused chain kernels that hold a chain in registers);
    callers check it before choosing the kernel's path (None: no limit).
    ``refuses(*static_args) -> reason | None``: why the kernel cannot take an
    op's static arguments, e.g. a network with an activation it lacks (None:
    it takes any); callers ask before choosing the kernel's path.
    ``pays_up_to``: the most elements per chain at which the kernel was
    measured to beat the per-step loop it replaces (None: wherever measured);
    beyond it automatic selection takes the per-step loop, and says so.
    ``backend``: the name of the backend that holds it (set by
    :meth:`KernelBackend.add`), for callers that take a related op from the same one.
    """

    op: str
    fn: Callable[..., Any]
    device_types: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    min_compute_capability: tuple[int, int] | None = None
    priority: int = 0
    max_event_size: int | None = None
    refuses: Callable[..., str | None] | None = None
    pays_up_to: int | None = None
    backend: str | None = None

    def mismatch(self, device: torch.device, dtype: torch.dtype, capability: tuple[int, int] | None) -> str | None:
        """Why this kernel cannot take inputs on ``device`` with ``dtype`` (None if it can)."""
        if device.type not in self.device_types:
            return f"device type '{device.type}' not supported (supports {', '.join(self.device_types)})"
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"dtype {str(dtype).removeprefix('torch.')} not supported (supports {names})"
        if device.type == "cuda" and self.min_compute_capability is not None:
            if capability is None or capability < self.min_compute_capability:
                have = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
                need = f"{self.min_compute_capability[0]}.{self.min_compute_capability[1]}"
                return f"compute capability {have} below the required {need}"
        return None


class KernelBackend:
    """A named set of kernels, registered through ``ebm_register_kernels``.

    Subclass it (or instantiate it directly) with a ``name`` and the kernels;
    override :meth:`unavailable_reason` when the whole backend may be unusable
    on this machine (no CUDA device, extension failed to build, ...).
    """

    def __init__(self, name: str, kernels: Sequence[Kernel] = (), description: str = "") -> None:
        self.name = name
        self.description = description
        self._kernels: dict[str, Kernel] = {}
        for kernel in kernels:
            self.add(kernel)

    def add(self, kernel: Kernel) -> None:
        """Add ``kernel`` under its ``op``; raises ``ValueError`` if this backend already has a kernel for that op. A
        kernel for a fused op is held to the op's signature when it is resolved (:mod:`ebmcore.kernels.fused`)."""
        if kernel.op in self._kernels:
            raise ValueError(f"backend '{self.name}' already has a kernel for op '{kernel.op}'")
        self._kernels[kernel.op] = kernel if kernel.backend == self.name else dataclasses.replace(kernel, backend=self.name)

    @property
    def kernels(self) -> dict[str, Kernel]:
        """Op name -> kernel."""
        return dict(self._kernels)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine, or None if it can."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, ops={sorted(self._kernels)})"
