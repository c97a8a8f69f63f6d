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

__all__ = [
    "MAX_WIDTH",
    "TRITON_VERSION",
    "PRECISIONS",
    "MEASURED_LAUNCH",
    "MEASURED_FASTER",
    "launch_config",
    "static_launch_config",
    "products",
    "unmeasured_reason",
]

MAX_WIDTH = 64
"""The widest layer (and state) the kernel takes, after padding (16, 32 or 64): a program holds a block of
activations of every layer in registers, and its weights in shared memory. At 128 the kernel spilled kilobytes of
registers on sm_90, and three hidden layers of 128 took 147-172 KB of shared memory (sm_80 has 164 KB)."""

TRITON_VERSION = "3.7.1"
"""The Triton version torch's CUDA wheel pins, the one the tests and ``make setup`` install."""

PRECISIONS = ("ieee", "tf32x3", "tf32", "bf16")
"""The products offered, accumulated in float32: IEEE float32 multiply-adds, Triton's split TF32 (``"tf32x3"``: each
operand as a TF32 high part and the TF32 rest, three tensor-core products, about float32's accuracy), TF32, and
bfloat16 operands (``"bf16"``: about 3 significant digits, the tensor cores' fastest float kind)."""

MEASURED_ON = "benchmarks/results/2026-11-27-h100-choices.json"
"""The recorded device results the launch configurations and ranks below come from (an H100, sm_90, W4's and W5's
network 2-64-64-1, padded to 16-64-64; derived from ``2026-11-27-h100-b11eeb6/T.md``, and held to it by
``tests/test_triton_launch_choices.py``)."""

MEASURED_LAUNCH: dict[tuple[str, str, tuple[int, ...]], tuple[int, int]] = {
    ("chain", "ieee", (16, 64, 64)): (32, 8),
    ("chain", "tf32", (16, 64, 64)): (64, 4),
    ("chain", "bf16", (16, 64, 64)): (64, 4),
    ("contrastive", "ieee", (16, 64, 64)): (32, 8),
    ("contrastive", "tf32", (16, 64, 64)): (32, 4),
}
"""``(kernel, products, padded widths) -> (block_n, num_warps)``: the fastest configuration of the device sweep among
those that do not spill (the contrastive kernel with TF32 products ran 1.64 ms at 128 × 8 and 2.08 at 64 × 4, both
spilling 516 bytes; 2.60 at 32 × 4, none). Elsewhere :func:`static_launch_config`'s."""

MEASURED_FASTER: dict[tuple[str, str], bool] = {
    ("chain", "ieee"): False,
    ("chain", "tf32"): True,
    ("chain", "bf16"): True,
    ("contrastive", "ieee"): True,
    ("contrastive", "tf32"): True,
}
"""``(kernel, products) -> whether the device sweep measured it faster than eager torch`` (W4: 1.01×, 11.5×, 14.5×
with IEEE, TF32, bfloat16 products, against the per-step loop's 1.00× and its captured graph's 1.01×; W5's chain:
2.69×, 3.59× with IEEE and TF32 products). A pair not here was not measured (split TF32 products, and bfloat16
products in the contrastive kernel, which crashed on the H100: :data:`CONTRASTIVE_BF16`): it runs with
``fused=True`` only."""

CONTRASTIVE_BF16 = (
    "crashed with 'an illegal memory access' on an H100 (2026-11-27, every launch configuration; every PTX address "
    "in bounds: a Triton sm_90 fault for a bfloat16 tl.dot(tl.trans(ce), inputs), triton-lang/triton#11366, #10486, "
    "#10573); its layer gradients now take TF32 products of bfloat16-rounded operands (the same values), not yet "
    "run on a GPU"
)
"""Why bfloat16 products in the contrastive kernel are not on the default path."""


def launch_config(padded: tuple[int, ...], precision: str, contrastive: bool = False) -> tuple[int, int]:
    """``(block_n, num_warps)``: chains and warps per program for a network of padded widths ``(d, h_1, …)``, the
    products' ``precision`` and the kernel (``contrastive``: :func:`feedforward_contrastive_chain`'s): the recorded
    device sweep's fastest that does not spill where it measured this network (:data:`MEASURED_LAUNCH`), else
    :func:`static_launch_config`'s."""
    measured = MEASURED_LAUNCH.get(("contrastive" if contrastive else "chain", precision, tuple(padded)))
    return measured if measured is not None else static_launch_config(padded, precision, contrastive)


def unmeasured_reason(precision: str, contrastive: bool = False) -> Optional[str]:
    """Why the kernel with these products does not rank above the per-step loop at ``fused=None`` (None: the
    recorded device sweep measured it faster, :data:`MEASURED_FASTER`)."""
    kernel = "contrastive" if contrastive else "chain"
    faster = MEASURED_FASTER.get((kernel, precision))
    if faster:
        return None
    if contrastive and precision == "bf16":
        return CONTRASTIVE_BF16
    if faster is None:
        return f"was not measured on a GPU ({MEASURED_ON})"
    return f"was measured no faster than the per-step loop ({MEASURED_ON})"


def static_launch_config(padded: tuple[int, ...], precision: str, contrastive: bool = False) -> tuple[int, int]:
    """``(block_n, num_warps)`` chosen without a GPU, by the machine code of every configuration from 16 to 128 chains
    on 4, 8 or 16 warps compiled for sm_90 (seven of them for sm_80 too), for eight networks from 2-32-1 to
    64-64-64-64-1 (``benchmarks/triton_static.py``; warp-instructions per chain-step in the step loop,
    :mod:`ebm_cuda.kernel_report`): near the fewest instructions among those that spill at most 64 bytes (one choice
    spills 72: below). What decides is the chains each warp holds:

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
    - Split TF32 products (``"tf32x3"``, three tensor-core products each): the chain as with TF32 ones, the
      contrastive kernel 16 on 4. For 2-64-64-1 on sm_90 every chain configuration spills (176 bytes at 64 on 4, the
      fewest instructions, 156 per chain-step; 228 and more at 16 or 32 chains per program); the contrastive kernel
      at 16 on 4 does not (524).

    Within 1.16 of the fewest instructions for the network of W4 and W5 (2-64-64-1), on sm_90 and sm_80, and 1.14 for
    the others but the ragged 3-40-17-5-1 (padded to 16-64-32-16): 1.36. The TF32 chain of 2-64-64-64-1 on sm_90
    spills 72 bytes (every configuration of 64 chains or more spills as much or more; 32 on 4, which spills less,
    issues 2.6 times the instructions). Instructions are a floor on the time, not a timing:
    ``benchmarks/triton_sweep.py`` (group T of ``gpu.py``) times these against the others on a GPU."""
    if precision == "tf32x3":
        return (16, 4) if contrastive else static_launch_config(padded, "tf32", False)
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


_FROM_TORCH = {"highest": "ieee", "high": "tf32", "medium": "bf16"}
"""``precision=None``: the products for torch's switch for float32 matrix products
(``torch.set_float32_matmul_precision``): "highest" float32-accurate ones, IEEE (split TF32 would be as accurate,
but its chain spills on sm_90 at every launch configuration: :func:`static_launch_config`), "high" TF32, "medium"
bfloat16 (which torch allows there; its own CUDA matrix products then still run TF32)."""


def products(precision: Optional[str]) -> str:
    """The products a Triton chain computes with: ``precision`` (one of :data:`PRECISIONS`), or, for None, those
    ``torch.get_float32_matmul_precision()`` asks for (:data:`_FROM_TORCH`)."""
    if precision is None:
        return _FROM_TORCH[torch.get_float32_matmul_precision()]
    if precision not in PRECISIONS:
        raise InputError(f"ebm_cuda.triton_chains: precision must be one of {', '.join(PRECISIONS)} or None, got {precision!r}.")
    return precision


_matmul_precision = products


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
