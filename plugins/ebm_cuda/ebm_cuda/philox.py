"""The kernels' random stream, drawn by the builds: Philox4x32-10 of ``csrc/ebm/philox.h`` (:func:`philox4x32`), and
the standard normals (:func:`normal`) and Metropolis uniforms (:func:`uniform`) the fused kernels draw from it, keyed
by ``seed`` at ``step``. :mod:`ebm_cuda.reference` reproduces them in PyTorch.
"""

from __future__ import annotations

from ctypes import c_int, c_int64, c_uint64, c_void_p

import torch
from torch import Tensor

from ebm_cuda.dispatch import _check_stream, _cuda_build, _run, _run_host
from ebm_cuda.native import NativeOp, define

__all__ = ["normal", "uniform", "philox4x32"]

# The stream's C functions, which no torch op wraps: the uniforms on the host build only, with no thread count; Philox
# itself with a stream on the CUDA build only.
define(NativeOp("normal", symbol="normal", argtypes=(c_void_p, c_int64, c_int, c_uint64, c_uint64)))
define(NativeOp("uniform", symbol="uniform", argtypes=(c_void_p, c_int64, c_uint64, c_uint64), builds=("host",), execution=()))
define(NativeOp("philox", symbol="philox", argtypes=(c_void_p, c_void_p, c_void_p, c_int64), execution=("cuda",)))


def normal(n: int, d: int, seed: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """The stream's standard normals ``(n, d)`` (float32) at ``step``: the noise a fused kernel adds there."""
    device = torch.device(device)
    out = torch.empty(n, d, dtype=torch.float32, device=device)
    _check_stream(seed, step)
    _run(device, "normal", out.data_ptr(), n, d, seed, step)
    return out


def uniform(n: int, seed: int, step: int) -> Tensor:
    """The stream's Metropolis uniforms ``(n,)`` in [0, 1) at ``step`` (host build; float32)."""
    _check_stream(seed, step)
    out = torch.empty(n, dtype=torch.float32, device="cpu")
    _run_host("uniform", (out,), "uniform", out.data_ptr(), n, seed, step)
    return out


def philox4x32(counters: Tensor, keys: Tensor) -> Tensor:
    """Philox4x32-10 of ``counters: (n, 4)`` under ``keys: (n, 2)`` (int64 holding uint32 words) -> ``(n, 4)``."""
    device = counters.device
    c = counters.to(torch.int64).to(torch.int32).contiguous()  # the same 32 bits
    k = keys.to(torch.int64).to(torch.int32).contiguous()
    out = torch.empty_like(c)
    if _cuda_build(device):  # the C functions take a stream there
        _run(device, "philox", c.data_ptr(), k.data_ptr(), out.data_ptr(), c.shape[0])
    else:
        _run_host("philox4x32", (c, k, out), "philox", c.data_ptr(), k.data_ptr(), out.data_ptr(), c.shape[0])
    return out.to(torch.int64) & 0xFFFFFFFF
