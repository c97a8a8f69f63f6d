"""How a Triton kernel of :mod:`ebm_cuda.triton_chains` is launched: chains and warps per program
(:func:`launch_config`), the padded widths (:func:`_pad`), the products (:data:`PRECISIONS`, torch's own switch for
``precision=None``), the stream position and per-chain tunables as the kernels take them, and where a kernel can run
(CUDA, or the CPU under Triton's interpreter). Triton is imported by :func:`_kernels`, on first use only.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Optional

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["MAX_WIDTH", "TRITON_VERSION", "PRECISIONS", "launch_config"]

MAX_WIDTH = 64
"""The widest layer (and state) the kernel takes, after padding (16, 32 or 64): a program holds a block of
activations of every layer in registers, and its weights in shared memory. At 128 the kernel spilled kilobytes of
registers on sm_90, and three hidden layers of 128 took 147-172 KB of shared memory (sm_80 has 164 KB)."""

TRITON_VERSION = "3.7.1"
"""The Triton version torch's CUDA wheel pins, the one the tests and ``make setup`` install."""

PRECISIONS = ("ieee", "tf32", "bf16")
"""The products offered, accumulated in float32: IEEE float32 and TF32 (Triton's ``input_precision``), and bfloat16
operands (``"bf16"``: about 3 significant digits, the tensor cores' fastest float kind). ``"tf32x3"`` is not offered:
it spills 228 bytes or more on sm_80 and sm_90."""


def launch_config(padded: tuple[int, ...], precision: str, contrastive: bool = False) -> tuple[int, int]:
    """``(block_n, num_warps)``: chains and warps per program for a network of padded widths ``(d, h_1, …)``, the
    products' ``precision`` and the kernel (``contrastive``: :func:`feedforward_contrastive_chain`'s). Chosen without a
    GPU, by the machine code of every configuration from 16 to 128 chains on 4, 8 or 16 warps compiled for sm_90 (seven
    of them for sm_80 too), for eight networks from 2-32-1 to 64-64-64-64-1 (``benchmarks/triton_static.py``;
    warp-instructions per chain-step in the step loop, :mod:`ebm_cuda.kernel_report`): near the fewest instructions
    among those that spill at most 64 bytes (one choice spills 72: below). What decides is the chains each warp holds:

    - TF32 and bfloat16 products: 16 chains per warp, the rows of one tensor-core tile (sm_90's 4-warp ``wgmma`` takes
      64): the chain 64 on 4 warps, the contrastive kernel (more registers: its weight-gradient products) 32 on 4.
      With fewer chains per warp, each warp computed its tile's rows several times over: 16 chains on 8 warps, the
      choice before, cost 9.9 times the instructions of the 2-64-64-1 chain with TF32 products. Where the registers
      run out, fewer: the chain of three 64-wide layers on a 64-wide state 32 on 8 (64 on 4 spilled up to 116
      bytes), the contrastive kernel on a 64-wide state 16 on 4 (32 on 4 spilled up to 892 bytes on sm_80).
    - IEEE products (no tensor cores: each product is a multiply-add): 16 chains on 4 warps. More chains per warp
      spilled; fewer cost more (16 on 16 warps, the choice before: 1.7 times the instructions for 2-64-64-1). The
      contrastive kernel on a state padded to 64 columns runs 16 on 16 warps: on 4 it spilled 1.8 KB and more.
    - A network of one hidden layer of at most 32 on a state of at most 16 columns (2-32-1), any products: 128 chains
      on 4 warps (the contrastive kernel with IEEE products: 32 on 4). A step's fixed work (the noise, the move)
      weighs most there, and larger programs share it: the 2-32-1 chain with IEEE products 121 → 55 instructions per
      chain-step on sm_90.

    Within 1.16 of the fewest instructions for the network of W4 and W5 (2-64-64-1), on sm_90 and sm_80, and 1.14 for
    the others but the ragged 3-40-17-5-1 (padded to 16-64-32-16): 1.36. The TF32 chain of 2-64-64-64-1 on sm_90
    spills 72 bytes (every configuration of 64 chains or more spills as much or more; 32 on 4, which spills less,
    issues 2.6 times the instructions). Instructions are a floor on the time, not a timing:
    ``benchmarks/triton_sweep.py`` (group T of ``gpu.py``) times these against the others on a GPU."""
    if len(padded) == 2 and padded[0] == 16 and padded[1] <= 32:  # one hidden layer of at most 32 on d <= 16
        return (32, 4) if contrastive and precision == "ieee" else (128, 4)
    if precision == "ieee":
        return (16, 16) if contrastive and padded[0] >= 64 else (16, 4)
    if contrastive:
        return (16, 4) if padded[0] >= 64 else (32, 4)
    return (32, 8) if _padded_weights(padded) >= 3 * MAX_WIDTH * MAX_WIDTH else (64, 4)


def _padded_weights(padded: tuple[int, ...]) -> int:
    """The hidden layers' padded weights ``Σ h_{l−1}·h_l`` (``h_0 = d``)."""
    return sum(a * b for a, b in zip(padded[:-1], padded[1:]))


def _pad(width: int) -> int:
    """The width the kernel computes with: the next power of 2, at least 16 (``tl.arange`` takes powers of 2, and
    ``tl.dot`` needs K ≥ 16)."""
    return max(16, 1 << (width - 1).bit_length())


def _triton_reason() -> Optional[str]:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # an absent or broken install: a reason, not an error
        return f"triton is not importable ({type(exc).__name__}: {exc}); pip install triton=={TRITON_VERSION}"
    return None


@functools.lru_cache(maxsize=1)
def _kernels() -> Any:
    """The jitted kernels (triton imported here, on first use)."""
    from ebm_cuda import _triton_kernels

    return _triton_kernels


_FROM_TORCH = {"highest": "ieee", "high": "tf32", "medium": "tf32"}
"""``precision=None``: the products torch's switch for float32 matrix products gives its own on CUDA
(``torch.set_float32_matmul_precision``: "medium" allows bfloat16, but CUDA's matrix products then run TF32, as for
"high"; bfloat16 products are asked for by name)."""


def _matmul_precision(precision: Optional[str]) -> str:
    if precision is None:
        return _FROM_TORCH[torch.get_float32_matmul_precision()]
    if precision not in PRECISIONS:
        raise InputError(f"ebm_cuda.triton_chains: precision must be one of {', '.join(PRECISIONS)} or None, got {precision!r}.")
    return precision


def _per_chain(value: Any, n: int, device: torch.device, what: str) -> tuple[float, Optional[Tensor]]:
    """A tunable as the kernel takes it: a float, or ``(0.0, float32 values (n,))``."""
    if isinstance(value, Tensor):
        if value.numel() == 1 and value.dim() == 0:
            return float(value), None
        flat = value.reshape(-1)
        if flat.shape[0] != n:
            raise InputError(
                f"ebm_cuda.triton_chains: {what} has {flat.shape[0]} values for {n} chains; give a number or one value per chain."
            )
        return 0.0, flat.to(device=device, dtype=torch.float32).contiguous()
    return float(value), None


def _check_block(block_n: Optional[int], what: str) -> None:
    if block_n is not None and (not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1)):
        raise InputError(
            f"ebm_cuda.triton_chains.{what}: block_n must be a power of 2 >= 16 or None (the default), got {block_n}."
        )


def _check_warps(num_warps: Optional[int], what: str) -> None:
    if num_warps is not None and num_warps not in (4, 8, 16):
        raise InputError(f"ebm_cuda.triton_chains.{what}: num_warps must be 4, 8, 16 or None (the default), got {num_warps}.")


def _launch(
    padded: tuple[int, ...], precision: str, contrastive: bool, block_n: Optional[int], num_warps: Optional[int]
) -> tuple[int, int]:
    """``(block_n, num_warps)`` as given, each None replaced by :func:`launch_config`'s (chosen for its own
    ``block_n``: a ``block_n`` given without ``num_warps`` runs on the default's warps)."""
    default_block, default_warps = launch_config(padded, precision, contrastive)
    return block_n or default_block, num_warps or default_warps


def _stream_arguments(seed: int, offset: int) -> tuple[int, int]:
    """``(seed, offset)`` as the ops take them (int64: a seed in [2⁶³, 2⁶⁴) as its bit pattern), checked."""
    seed, offset = int(seed), int(offset)
    if not 0 <= seed < 2**64 or not 0 <= offset < 2**62:
        raise InputError(
            f"ebm_cuda.triton_chains: seed must be in [0, 2^64) and offset in [0, 2^62); got seed {seed}, offset {offset}."
        )
    return (seed - 2**64 if seed >= 2**63 else seed), offset


def _interpreted() -> bool:
    """Whether the kernels were jitted under Triton's interpreter (``TRITON_INTERPRET=1`` when they were first loaded)."""
    return not _kernels().COMPILED


def _runs_here(x: Tensor, name: str) -> None:
    """The ops' check that a kernel can run on ``x``'s device: CUDA, or the CPU under Triton's interpreter."""
    if x.device.type != "cuda" and not (x.device.type == "cpu" and _triton_reason() is None and _interpreted()):
        raise InputError(
            f"ebm_cuda::{name}: the Triton kernels run on CUDA tensors, got {x.device} (on the CPU only "
            f"under Triton's interpreter: TRITON_INTERPRET=1 set before triton is imported)."
        )
    if x.device.type == "cuda" and torch.version.cuda is None:
        raise InputError(
            f"ebm_cuda::{name}: the Triton kernels are written for NVIDIA GPUs (their activations are PTX "
            f"instructions), and this torch build has no CUDA (torch {torch.__version__}): use the "
            f"per-step loop (fused=False)."
        )


def _kernel_precision(precision: str, x: Tensor) -> str:
    """The kernel's ``PRECISION``: ``precision``, but bfloat16 products under Triton's interpreter (whatever the
    tensors' device) are ``"bf16-emulated"`` (``_triton_kernels._dot``)."""
    if precision not in PRECISIONS:
        raise InputError(f"ebm_cuda::triton ops: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
    return "bf16-emulated" if precision == "bf16" and _interpreted() else precision


def _on(device: torch.device) -> Any:
    """``torch.cuda.device(device)`` for a CUDA device (the kernel must launch on the inputs' GPU), else nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
