"""What every ``torch.ops.ebm_cuda.*`` op shares: the eager call (:func:`call`, of :mod:`ebm_cuda.native`, where the
ops are defined from their rows), the checks of its tensors, and the launch on the build that matches their device
(:func:`_run`, :func:`_run_host`).

An op runs the host build on CPU tensors and the CUDA build on CUDA tensors (on the current stream); the ops that have no CUDA build (the network kernels: :mod:`ebm_cuda.feedforward_ops`, :mod:`ebm_cuda.conv_ops`) launch through
:func:`_run_host`, which refuses a tensor on any other device. States compute in their math dtype
(:func:`math_dtype`). Random draws come from the Philox stream of ``csrc/ebm/philox.h`` keyed by ``seed`` at steps
``offset, offset + 1, ...`` (:func:`_check_stream`; :mod:`ebm_cuda.philox` draws it). The tests' ``cuda_emulation``
(:mod:`ebm_cuda.testing`, which the runtime never imports) runs the CUDA path on CPU tensors by setting :data:`_EMULATED`.
"""

from __future__ import annotations

import ctypes
import os
from contextvars import ContextVar
from typing import Iterable, Optional

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebm_cuda import library
from ebm_cuda.library import DTYPE_CODES
from ebm_cuda.native import call

__all__ = ["call", "math_dtype"]

_CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_SYNC = os.environ.get("EBM_CUDA_SYNC", "") not in ("", "0")
_SEED_LIMIT = 2**63


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in for states of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(x: Tensor, what: str) -> Tensor:
    if x.dim() != 2:
        raise InputError(f"ebm_cuda.{what}: x must be (n_chains, dim), got shape {tuple(x.shape)}.")
    device_type = x.device.type  # read once: each read makes an object
    if x.dtype not in DTYPE_CODES or (device_type == "cuda" and x.dtype not in _CUDA_DTYPES):
        raise InputError(
            f"ebm_cuda.{what}: dtype {x.dtype} is not supported on {device_type}; "
            "use float32, bfloat16 or float16 (float64 on CPU), or the torch backend."
        )
    if device_type not in ("cpu", "cuda"):
        raise InputError(f"ebm_cuda.{what}: tensors on {x.device} are not supported (cpu or cuda).")
    if x.shape[0] >= 2**32:
        raise InputError(f"ebm_cuda.{what}: at most 2**32 - 1 chains per call, got {x.shape[0]}.")
    return x.contiguous()


_EMULATED: ContextVar[Optional[library.Library]] = ContextVar("ebm_cuda_emulated", default=None)
"""The host-built ``kernels.cu`` that CPU tensors run on instead of the host build, set by the tests'
``cuda_emulation`` (None: the host build)."""


def _cuda_build(device: torch.device) -> bool:
    """Whether ``device``'s tensors run on a build of ``kernels.cu`` (a GPU's, or the host emulation's)."""
    return device.type == "cuda" or _EMULATED.get() is not None


def _run(device: torch.device, name: str, *args) -> None:
    if device.type == "cuda":
        with torch.cuda.device(device):
            library.cuda(device).call(name, *args, ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream))
            if _SYNC:  # EBM_CUDA_SYNC=1: surface asynchronous kernel errors at the call that caused them
                torch.cuda.synchronize(device)
    elif _EMULATED.get() is not None:
        _EMULATED.get().call(name, *args, None)
    else:
        _run_host(name, (device,), name, *args, torch.get_num_threads())


_HOST_ONLY_FIX = (
    "Move the tensors (a network's weights and biases too) to the CPU, or on a GPU select another backend: "
    "triton runs the feed-forward chains, torch every op."
)
"""What to do where a tensor off the CPU reaches an op that only the host build runs."""


def _run_host(what: str, on: Iterable[Tensor | torch.device | None], name: str, *args) -> None:
    """Run the host build's ``name`` for the op ``what`` on ``args``, whose pointers point into the tensors ``on`` (or
    tensors on the devices ``on``): the host build reads and writes them from the CPU, so a tensor on any other device
    (a CUDA or meta tensor) is refused here, with the fix, and never dereferenced. The caller appends the thread count
    where ``name`` takes one."""
    if all(t is None or (t.is_cpu if isinstance(t, Tensor) else t.type == "cpu") for t in on):  # the usual case
        library.host().call(name, *args)
        return
    devices = [t if isinstance(t, torch.device) else t.device for t in on if t is not None]
    elsewhere = sorted({str(device) for device in devices if device.type != "cpu"})
    if elsewhere:
        raise InputError(
            f"ebm_cuda.{what}: the host build runs it, on CPU tensors only; got tensors on "
            f"{', '.join(elsewhere)}. {_HOST_ONLY_FIX}"
        )
    library.host().call(name, *args)


def _like(t: Tensor, x: Tensor, name: str) -> Tensor:
    """``t`` with ``x``'s shape checked, on ``x``'s device and dtype, contiguous."""
    if t.shape != x.shape:
        raise InputError(f"ebm_cuda: {name} must have the shape of x, {tuple(x.shape)}, got {tuple(t.shape)}.")
    return t.to(device=x.device, dtype=x.dtype).contiguous()


def _vector(v: Optional[Tensor], x: Tensor, name: str) -> Optional[Tensor]:
    if v is None:
        return None
    if v.shape != (x.shape[0],):
        raise InputError(f"ebm_cuda: {name} must have shape (n_chains,) = ({x.shape[0]},), got {tuple(v.shape)}.")
    return v.to(device=x.device, dtype=math_dtype(x.dtype)).contiguous()


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _check_stream(seed: int, offset: int) -> None:
    if not (0 <= seed < _SEED_LIMIT and 0 <= offset < _SEED_LIMIT):
        raise InputError(f"ebm_cuda: seed and offset must be in [0, 2**63), got {seed} and {offset}.")


def _chain_run(
    what: str,
    x: Tensor,
    n_steps: int,
    min_steps: int,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The checks every chain op makes of its run (``n_steps >= min_steps``, the stream position), and its per-chain
    step sizes and noise scales for states ``x`` (None: the scalars)."""
    _check_stream(seed, offset)
    if n_steps < min_steps:
        raise InputError(f"ebm_cuda.{what}: n_steps must be >= {min_steps}, got {n_steps}.")
    return _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")


def _scalar_or_vector(value: object) -> tuple[float, Optional[Tensor]]:
    """A tunable as the ops take it: a float, or ``(0.0, per-chain values (n,))``."""
    if isinstance(value, Tensor):
        return (float(value), None) if value.numel() == 1 and value.dim() == 0 else (0.0, value.reshape(-1))
    return float(value), None
