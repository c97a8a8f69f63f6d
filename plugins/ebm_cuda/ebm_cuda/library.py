"""The compiled kernels, loaded with ctypes: :func:`host` (CPU) and :func:`cuda` (GPU).

Each C function takes raw pointers and returns 0, or 1 with a message (``*_last_error``), which
:class:`Library` raises as :class:`KernelError`. :func:`host_unavailable_reason` and
:func:`cuda_unavailable_reason` say why a library cannot be used here (and are what the kernel
backends report); they build the library on first use, once per process.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_double, c_int, c_void_p

import torch

from ebm_cuda import build, native

__all__ = [
    "ENERGY",
    "EnergySpec",
    "KernelError",
    "Library",
    "host",
    "cuda",
    "host_unavailable_reason",
    "cuda_unavailable_reason",
    "gpu_absent_reason",
    "DTYPE_CODES",
]

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}


class KernelError(RuntimeError):
    """A kernel refused its inputs or failed to launch; the message is the kernel's."""


class EnergySpec(ctypes.Structure):
    """The C API's ``ebm_energy``: kind, d, vectors v0 (mean/center), v1 (precision), scalars a, b."""

    _fields_ = [("kind", c_int), ("d", c_int), ("v0", c_void_p), ("v1", c_void_p), ("a", c_double), ("b", c_double)]


_EXEC = {"host": c_int, "cuda": c_void_p}
"""The last argument of a C function that takes one (:attr:`ebm_cuda.native.NativeOp.execution`): the host build's
thread count, the CUDA build's stream."""

ENERGY = POINTER(EnergySpec)
"""The ctypes type of a C function's ``const ebm_energy*`` argument."""


class Library:
    """One loaded build: ``lib.call("energy", ...)`` runs ``ebm_<prefix>_energy`` and raises on failure."""

    def __init__(self, path: str, prefix: str) -> None:
        self.path = path
        self.prefix = prefix
        self._lib = ctypes.CDLL(path)
        self._functions = {}
        for row in native.table().values():  # the C functions of this build, typed by their rows
            if row.symbol is None or prefix not in row.builds:
                continue
            fn = getattr(self._lib, f"ebm_{prefix}_{row.symbol}")
            fn.argtypes = [*row.argtypes, *([_EXEC[prefix]] if prefix in row.execution else [])]
            fn.restype = c_int
            self._functions[row.symbol] = fn
        self._error = getattr(self._lib, f"ebm_{prefix}_last_error")
        self._error.restype = ctypes.c_char_p

    def call(self, name: str, *args) -> None:
        if self._functions[name](*args) != 0:
            raise KernelError(f"ebm_cuda {self.prefix} kernel {name}: {self._error().decode()}")


_loaded: dict[str, Library | str] = {}  # "host" / "cuda-sm90" -> the library, or why it could not be built


def _load(name: str, make) -> Library | str:
    if name not in _loaded:
        try:
            _loaded[name] = make()
        except (build.BuildError, OSError, AttributeError) as exc:
            _loaded[name] = f"the {name} kernels could not be built: {exc}"
    return _loaded[name]


def _build_host() -> Library | str:
    if "host" in _loaded:  # built (or failed) already: no compiler search on every launch
        return _loaded["host"]
    given = os.environ.get("EBM_CUDA_HOST_LIBRARY")
    if given:  # a host library built elsewhere, e.g. build.build_host_sanitized()'s
        return _load("host", lambda: Library(given, "host"))
    if build.find_cxx() is None:
        return "no C++ compiler to build the host kernels (install g++ or clang++, or set CXX)"
    return _load("host", lambda: Library(str(build.build_host()), "host"))


def host_unavailable_reason() -> str | None:
    """Why the host (CPU) kernels cannot run here, or None. The first call builds them (about 10 s
    once per machine, then cached), so that a failed build is a reason, not an error later."""
    lib = _build_host()
    return lib if isinstance(lib, str) else None


def host() -> Library:
    """The host library (built on first use, cached on disk)."""
    lib = _build_host()
    if isinstance(lib, str):
        raise KernelError(lib)
    return lib


def gpu_absent_reason() -> str | None:
    """Why this machine has no GPU to test on (a CPU-only torch build, or no visible device), or None."""
    if torch.version.cuda is None:
        return f"no GPU: this torch build has no CUDA (torch {torch.__version__})"
    if not torch.cuda.is_available():
        return "no GPU: no CUDA device is visible (torch.cuda.is_available() is False)"
    return None


def _cuda_precondition() -> str | None:
    if torch.version.cuda is None:
        return f"this torch build has no CUDA (torch {torch.__version__}, torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    if build.find_nvcc() is None:
        return "nvcc not found to build the kernels (install the CUDA toolkit, or set NVCC or CUDA_HOME)"
    return None


def _build_cuda(device: torch.device | None = None) -> Library | str:
    """The library for ``device``'s compute capability (each capability its own build)."""
    reason = _cuda_precondition()
    if reason:
        return reason
    arch = "{}{}".format(*torch.cuda.get_device_capability(device))
    return _load(f"cuda-sm{arch}", lambda: Library(str(build.build_cuda([arch])), "cuda"))


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA kernels cannot run on the current device, or None. The first call builds them
    for its compute capability (about 45 s once per machine with nvcc, then cached)."""
    lib = _build_cuda()
    return lib if isinstance(lib, str) else None


def cuda(device: torch.device | None = None) -> Library:
    """The CUDA library for ``device`` (default: the current one), built on first use (cached)."""
    try:
        lib = _loaded.get("cuda-sm{}{}".format(*torch.cuda.get_device_capability(device)))
    except (AssertionError, RuntimeError):  # a CPU-only torch, or no such device
        lib = None
    if lib is None:
        lib = _build_cuda(device)
    if isinstance(lib, str):
        raise KernelError(f"the CUDA kernels cannot run: {lib}")
    return lib
