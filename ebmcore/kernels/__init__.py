"""Kernel backends: ops implemented by several backends, resolved per device capability."""

from ebmcore.kernels.base import Kernel, KernelBackend
from ebmcore.kernels.resolve import Candidate, Explanation, dispatch, explain, resolve_kernel, use_backend

__all__ = ["Kernel", "KernelBackend", "Candidate", "Explanation", "dispatch", "explain", "resolve_kernel", "use_backend"]
