"""Registers the ``cuda``, ``cpu_fused`` and ``triton`` kernel backends with ebmcore (entry point ``cuda``),
and the ``ebm cuda`` command (``ebm cuda info``, ``ebm cuda build``)."""

from __future__ import annotations

from ebmcore import hookimpl
from ebmcore.registry import Registrar


@hookimpl
def ebm_register_kernels(registry: Registrar) -> None:
    from ebm_cuda.backends import CudaBackend, HostBackend, TritonBackend

    registry.register_kernel_backend(CudaBackend())
    registry.register_kernel_backend(HostBackend())
    registry.register_kernel_backend(TritonBackend())


@hookimpl
def ebm_add_commands(subparsers) -> None:
    from ebm_cuda import cli

    cli.add_command(subparsers)
