"""The fused Langevin chain of a feed-forward energy on CUDA, written in Triton: ``feedforward_langevin_chain``, and
the same chain with contrastive divergence's energies, loss and weight gradient: ``feedforward_contrastive_chain``.

One program holds ``block_n`` chains (rows; by default :func:`launch_config`'s: 16 with IEEE products, 32 or 64 with
tensor-core ones, 128 for the smallest networks) and runs all ``n_steps`` steps on them: per step the forward pass
(``tl.dot`` per layer, the activation and its derivative), the chain rule backwards (``tl.dot`` with the same
weights), and the move ``x ← x − h∇ₓE(x) + s·ξ``. The weights are read once per program; the states once and
written once per launch, whatever ``n_steps`` is. The contrastive chain is the same kernel with one ``tl.constexpr``
more: its passes at the starts (the first step's) and at the ends (one pass more) also give the energies and the
block's part of the weight gradient (:func:`feedforward_contrastive_chain`).

- **Networks:** the :class:`~ebmcore.energies.program.FeedForward` programs of the host build with 1 to
  :data:`MAX_HIDDEN` hidden layers (one kernel specialised per depth and activations through ``tl.constexpr``),
  activations of :data:`ACTIVATIONS` (SiLU, tanh, sigmoid, ReLU), any sign. Every width is padded with zeros to a
  power of 2 of at least 16 (``tl.arange`` takes powers of 2, ``tl.dot`` needs K ≥ 16), at most :data:`MAX_WIDTH`;
  :func:`refusal` says why a network is not taken.
- **Precision:** the state is float32, bfloat16 or float16 (loaded once, the math in float32, rounded to nearest even
  once per launch, when it is stored); the weights are copied to padded float32. The products are IEEE float32
  (``input_precision="ieee"``) unless ``precision="tf32"`` is given, or, with ``precision=None``, the
  default, torch's own switch for float32 products asks for TF32 (``torch.set_float32_matmul_precision("high")`` or
  ``"medium"``), as it does for the per-step path's matrix products on CUDA; ``precision="bf16"``, by name only, rounds
  every product's operands to bfloat16 (summed in float32). Compiled, the activations' exponentials and reciprocals
  are one approximate instruction each (``ex2.approx.ftz.f32``, ``rcp.approx.ftz.f32``: Triton's own ``exp`` and
  division use the same hardware approximations and keep subnormals, at 3 to 8 instructions more each); under
  Triton's interpreter, which runs no PTX, they are ``tl.exp`` and a division.
- **Noise:** the Philox stream of the C kernels (:mod:`ebm_cuda.reference`, ``docs/cuda.md``): element ``j`` of chain
  ``i`` at step ``t`` (``t = offset + k`` at the ``k``-th step of a call) is normal ``j mod 4`` of Philox4x32-10 with key
  ``(seed mod 2³², seed // 2³²)`` and counter ``(j // 4, i, t mod 2³², t // 2³²)``, by Box–Muller on the words ``(w0, w1)``
  and ``(w2, w3)`` (``u1 = ((w >> 8) + 1)·2⁻²⁴``, ``u2 = (w >> 8)·2⁻²⁴``). It is a function of (seed, step, chain,
  element) only, so ``k`` steps then ``m`` steps at ``offset + k`` equal ``k + m`` steps, and neither the chain count
  nor the block size changes a chain's noise (with 64 chains per program or more the kernel draws the normals of the
  first columns only, ``_triton_kernels.noise_columns``, and widens them with zeros: the same values). Its float32
  ``log``, ``sqrt``, ``cos`` and ``sin`` are Triton's, so it equals the host build's normals to float32 rounding
  (about 1e-6), not to the bit.

Each launch goes through a ``torch.library`` op (``torch.ops.ebm_cuda.triton_langevin_chain``, ``.triton_contrastive_chain``:
tensors and numbers in, with a fake implementation) that runs on CUDA tensors, and on CPU tensors under Triton's
interpreter. Triton is imported when a kernel is first launched, never when this module is imported: without it the package
imports and installs, and :func:`unavailable_reason` says why the ``triton`` backend cannot run. Under Triton's
interpreter (``TRITON_INTERPRET=1`` in the environment before triton is imported) the same kernels run on CPU
tensors; that is how CI tests them (``tests/test_triton_chains.py``).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch import Tensor

from ebmcore.energies import feedforward
from ebmcore.energies.program import ActivationKind, FeedForward
from ebmcore.errors import InputError
from ebm_cuda.dispatch import _op
from ebm_cuda.kernel_report import ptxas_report

__all__ = [
    "ACTIVATIONS",
    "MAX_HIDDEN",
    "MAX_WIDTH",
    "DTYPES",
    "MIN_COMPUTE_CAPABILITY",
    "TRITON_VERSION",
    "PRECISIONS",
    "launch_config",
    "refusal",
    "unavailable_reason",
    "feedforward_langevin_chain",
    "feedforward_contrastive_chain",
    "stream_normals",
    "kernel_arguments",
    "compile_report",
    "normals_compile_report",
]

ACTIVATIONS: dict[ActivationKind, int] = {
    ActivationKind.SILU: 0,
    ActivationKind.TANH: 1,
    ActivationKind.SIGMOID: 2,
    ActivationKind.RELU: 3,
}
"""The activations the Triton chain runs, and their codes in the kernel (a ``tl.constexpr`` per layer)."""

MAX_HIDDEN = 3
"""The most hidden layers the kernel is specialised for."""

MAX_WIDTH = 64
"""The widest layer (and state) the kernel takes, after padding (16, 32 or 64): a program holds a block of
activations of every layer in registers, and its weights in shared memory. At 128 the kernel spilled kilobytes of
registers on sm_90, and three hidden layers of 128 took 147-172 KB of shared memory (sm_80 has 164 KB)."""

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The chain states the kernel takes; the math is float32."""

MIN_COMPUTE_CAPABILITY = (8, 0)
"""Ampere or newer: the GPUs the kernel is compiled for in CI (sm_80, sm_90) and the oldest with TF32 products."""

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


def refusal(network: FeedForward) -> Optional[str]:
    """Why the Triton chain cannot run ``network`` (None: it can)."""
    hidden = network.hidden
    if not hidden:
        return "needs a hidden layer (this energy is linear)"
    if len(hidden) > MAX_HIDDEN:
        return f"takes at most {MAX_HIDDEN} hidden layers, the network has {len(hidden)}"
    missing = sorted(
        {str(layer.activation) for layer in hidden if layer.activation.kind not in ACTIVATIONS or layer.activation.params}
    )
    if missing:
        return f"has no {', '.join(missing)} (it takes {', '.join(k.value for k in ACTIVATIONS)})"
    widest = max(network.widths[:-1])
    if _pad(widest) > MAX_WIDTH:
        return f"takes layers at most {MAX_WIDTH} wide, the network has one {widest} wide"
    return None


def _triton_reason() -> Optional[str]:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # an absent or broken install: a reason, not an error
        return f"triton is not importable ({type(exc).__name__}: {exc}); pip install triton=={TRITON_VERSION}"
    return None


def unavailable_reason() -> Optional[str]:
    """Why the Triton kernels cannot run on this machine's CUDA devices (None: they can). Imports triton only where
    torch sees a CUDA device."""
    if torch.version.cuda is None:
        return f"this torch build has no CUDA (torch {torch.__version__}, torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return _triton_reason()


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


def kernel_arguments(network: FeedForward, device: torch.device) -> tuple[list[Tensor], tuple[int, ...], tuple[int, ...]]:
    """The network as the kernel reads it: ``[W_1, b_1, …, W_H, b_H, sign·w_out]`` padded with zeros to widths of
    16, 32 or 64 (float32, contiguous, on ``device``), the padded widths ``(d, h_1, …, h_H)`` and the activation codes."""
    widths = network.widths[:-1]
    padded = tuple(_pad(w) for w in widths)
    tensors: list[Tensor] = []
    for l, layer in enumerate(network.hidden):
        weight = layer.linear.weight.detach()
        w = torch.zeros(padded[l + 1], padded[l], dtype=torch.float32, device=device)
        w[: weight.shape[0], : weight.shape[1]] = weight
        b = torch.zeros(padded[l + 1], dtype=torch.float32, device=device)
        if layer.linear.bias is not None:
            b[: weight.shape[0]] = layer.linear.bias.detach()
        tensors += [w, b]
    out = network.layers[-1].linear.weight.detach()[0]
    wo = torch.zeros(padded[-1], dtype=torch.float32, device=device)
    wo[: out.shape[0]] = out * network.sign
    tensors.append(wo)
    return tensors, padded, tuple(ACTIVATIONS[layer.activation.kind] for layer in network.hidden)


def _check(x: Tensor, network: FeedForward, n_steps: int, what: str = "feedforward_langevin_chain", min_steps: int = 0) -> None:
    if x.dim() != 2:
        raise InputError(f"ebm_cuda.triton_chains.{what}: x must be (n_chains, d), got shape {tuple(x.shape)}.")
    if x.dtype not in DTYPES:
        raise InputError(
            f"ebm_cuda.triton_chains.{what}: x is {x.dtype}; it takes "
            f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)} (x.float())."
        )
    if network.widths[0] != x.shape[1]:
        raise InputError(f"ebm_cuda.triton_chains.{what}: the network takes {network.widths[0]} features, x has {x.shape[1]}.")
    reason = refusal(network)
    if reason is not None:
        raise InputError(f"ebm_cuda.triton_chains.{what}: the kernel {reason}.")
    feedforward.check_layers(network)  # one dtype and device for every layer
    first = network.layers[0].linear.weight
    if first.device != x.device:
        raise InputError(
            f"ebm_cuda.triton_chains.{what}: the network is on {first.device}, x on "
            f"{x.device}; move one to the other (model.to(x.device))."
        )
    if n_steps < min_steps:
        raise InputError(f"ebm_cuda.triton_chains.{what}: n_steps must be >= {min_steps}, got {n_steps}.")


def _check_block(block_n: Optional[int], what: str) -> None:
    if block_n is not None and (not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1)):
        raise InputError(
            f"ebm_cuda.triton_chains.{what}: block_n must be a power of 2 >= 16 or None (the default), got {block_n}."
        )


def _check_warps(num_warps: Optional[int], what: str) -> None:
    if num_warps is not None and num_warps not in (4, 8, 16):
        raise InputError(f"ebm_cuda.triton_chains.{what}: num_warps must be 4, 8, 16 or None (the default), got {num_warps}.")


def feedforward_langevin_chain(
    x: Tensor,
    network: FeedForward,
    *,
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    precision: Optional[str] = None,
    block_n: Optional[int] = None,
    noise: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
    num_warps: Optional[int] = None,
) -> Tensor:
    """``n_steps`` Langevin steps ``x ← x − h∇ₓE(x) + s·ξ`` of the feed-forward energy ``network`` in one launch;
    ``x: (n, d)`` float32, bfloat16 or float16 (math in float32, rounded once at the end). ``step_size``,
    ``noise_scale``: numbers or one value per chain ``(n,)``. ``ξ`` is drawn in the kernel from the stream of the
    module docstring at steps ``offset, …, offset + n_steps − 1``, or, with ``noise: (n_steps, n, d)``, read from
    that tensor (for tests). ``precision``: the products (:data:`PRECISIONS`: ``"ieee"``, ``"tf32"`` or ``"bf16"``;
    None: what ``torch.get_float32_matmul_precision()`` gives torch's matrix products on CUDA, ``"highest"`` IEEE,
    ``"high"`` and ``"medium"`` TF32). ``block_n``: chains per
    program (a power of 2, at least 16; the noise and the masking do not depend on it, the products' rounding may, in
    the last bit), and ``num_warps``: warps per program (4, 8 or 16); None: :func:`launch_config`'s, for tuning
    (``benchmarks/triton_sweep.py``). ``out``: an ``(n, d)`` tensor of ``x``'s dtype on ``x``'s device to write into
    (returned)."""
    _check(x, network, n_steps)
    n, d = x.shape
    result = out if out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or out.stride(1) != 1):
        raise InputError(
            f"ebm_cuda.triton_chains.feedforward_langevin_chain: out must be {tuple(x.shape)} {x.dtype} on "
            f"{x.device} with unit column stride."
        )
    _check_block(block_n, "feedforward_langevin_chain")
    _check_warps(num_warps, "feedforward_langevin_chain")
    seed64, offset = _stream_arguments(seed, offset)
    if n == 0:
        return result
    if n_steps == 0:
        return result.copy_(x)
    if noise is not None and noise.shape != (n_steps, n, d):
        raise InputError(
            f"ebm_cuda.triton_chains.feedforward_langevin_chain: noise must be (n_steps, n, d) = "
            f"{(n_steps, n, d)}, got {tuple(noise.shape)}."
        )
    tensors, padded, acts = kernel_arguments(network, x.device)
    h, hv = _per_chain(step_size, n, x.device, "step_size")
    s, sv = _per_chain(noise_scale, n, x.device, "noise_scale")
    xs = x.detach()
    if xs.stride(1) != 1:
        xs = xs.contiguous()
    noise_t = noise.detach().to(device=x.device, dtype=torch.float32).contiguous() if noise is not None else None
    products = _matmul_precision(precision)
    block_n, num_warps = _launch(padded, products, False, block_n, num_warps)
    with torch.no_grad():
        _LANGEVIN_OP(
            xs,
            result,
            tensors,
            list(padded),
            list(acts),
            n_steps,
            h,
            s,
            hv,
            sv,
            seed64,
            offset,
            products,
            block_n,
            num_warps,
            noise_t,
        )
    return result


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


def _triton_langevin_chain(
    x: Tensor,
    out: Tensor,
    tensors: list[Tensor],
    padded: list[int],
    acts: list[int],
    n_steps: int,
    h: float,
    s: float,
    hv: Optional[Tensor],
    sv: Optional[Tensor],
    seed: int,
    offset: int,
    precision: str,
    block_n: int,
    num_warps: int,
    noise: Optional[Tensor],
) -> None:
    """``torch.ops.ebm_cuda.triton_langevin_chain``: :func:`feedforward_langevin_chain`'s launch, into ``out``
    (arguments as ``kernel_arguments`` and ``_per_chain`` give them; ``seed`` int64, its bit pattern)."""
    _runs_here(x, "triton_langevin_chain")
    with _on(x.device):  # Triton launches on the current device
        _kernels().launch_langevin(
            x,
            out,
            tensors,
            padded,
            acts,
            n_steps,
            h,
            s,
            hv,
            sv,
            seed % 2**64,
            offset,
            _kernel_precision(precision, x),
            block_n,
            num_warps,
            noise,
        )


def _triton_contrastive_chain(
    x: Tensor,
    tensors: list[Tensor],
    padded: list[int],
    acts: list[int],
    n_steps: int,
    h: float,
    s: float,
    hv: Optional[Tensor],
    sv: Optional[Tensor],
    seed: int,
    offset: int,
    precision: str,
    block_n: int,
    num_warps: int,
    a: Tensor,
    b: Optional[Tensor],
    bo: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.ops.ebm_cuda.triton_contrastive_chain``: :func:`feedforward_contrastive_chain`'s launch (``n >= 1``
    chains): ``(x', energies (2, n), Σ over the programs' partial sums (P,))``, all float32 but ``x'``."""
    _runs_here(x, "triton_contrastive_chain")
    n = x.shape[0]
    result = torch.empty_like(x, memory_format=torch.contiguous_format)
    energies = torch.empty(2, n, dtype=torch.float32, device=x.device)
    partials = torch.empty(2 * (-(-n // block_n)), _partial_size(tuple(padded)), dtype=torch.float32, device=x.device)
    with _on(x.device):
        _kernels().launch_langevin(
            x,
            result,
            tensors,
            padded,
            acts,
            n_steps,
            h,
            s,
            hv,
            sv,
            seed % 2**64,
            offset,
            _kernel_precision(precision, x),
            block_n,
            num_warps,
            None,
            contrastive=(a, b, energies, partials, bo),
        )
    return result, energies, partials.sum(0)


_LANGEVIN_OP = _op("triton_langevin_chain", _triton_langevin_chain, mutates_args=("out",))
_CONTRASTIVE_OP = _op("triton_contrastive_chain", _triton_contrastive_chain)


@torch.library.register_fake("ebm_cuda::triton_langevin_chain")
def _(x, out, tensors, padded, acts, n_steps, h, s, hv, sv, seed, offset, precision, block_n, num_warps, noise):
    return None


@torch.library.register_fake("ebm_cuda::triton_contrastive_chain")
def _(x, tensors, padded, acts, n_steps, h, s, hv, sv, seed, offset, precision, block_n, num_warps, a, b, bo):
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty(2, x.shape[0], dtype=torch.float32),
        x.new_empty(_partial_size(tuple(padded)), dtype=torch.float32),
    )


def _coefficients(
    pairs: tuple[tuple[Any, Any], tuple[Any, Any]],
    n: int,
    device: torch.device,
) -> tuple[Tensor, Optional[Tensor]]:
    """``start``, ``end`` as the kernel reads them: ``a: (2, n)`` float32 and ``b: (2, n)`` (zero for a None ``b``; None
    when both are None)."""
    for name, pair in zip(("start", "end"), pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InputError(f"ebm_cuda.triton_chains.feedforward_contrastive_chain: {name} must be a pair (a, b), got {pair!r}.")
    a = torch.empty(2, n, dtype=torch.float32, device=device)
    b = None if pairs[0][1] is None and pairs[1][1] is None else torch.zeros(2, n, dtype=torch.float32, device=device)
    for side, (name, pair) in enumerate(zip(("start", "end"), pairs)):
        for row, value, what in ((a, pair[0], f"{name}[0]"), (b, pair[1], f"{name}[1]")):
            if value is None:
                if row is a:
                    raise InputError(
                        f"ebm_cuda.triton_chains.feedforward_contrastive_chain: {what} (a) must be a number or "
                        f"one value per chain, got None."
                    )
                continue
            number, vector = _per_chain(value, n, device, what)
            row[side] = vector if vector is not None else number
    return a, b


def feedforward_contrastive_chain(
    x: Tensor,
    network: FeedForward,
    *,
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    start: tuple[Any, Any],
    end: tuple[Any, Any],
    precision: Optional[str] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> tuple[Any, ...]:
    """Contrastive divergence's chains with their loss and weight gradient, in one launch: the ``n_steps >= 1`` moves
    of :func:`feedforward_langevin_chain` from ``x: (n, d)`` (its kernel with ``CONTRASTIVE`` set: the same code for
    the passes and moves, so the same states for the same seed, offset, precision and block size; to the bit under
    Triton's interpreter, where the tests compare them), and, at the starts ``x`` and at the ends
    ``x'``, the energies and ``Σᵣ cᵣ ∂E(xᵣ)/∂θ`` for every weight and bias ``θ``, ``c = a + b·E``, with ``(a, b) =
    start`` at the starts and ``end`` at the ends (numbers or ``(n,)``; ``b`` None: zero). The pass at the starts is
    the first step's own (its ``∇ₓE`` makes the first move); one pass more, after the last move, gives the ends'.
    Returns ``(x', E(x): (n,), E(x'): (n,), loss: (), weight grads, bias grads)`` like the host build's
    (``ebm_cuda.backends.feedforward_contrastive_chain``): the loss ``Σᵣ aᵣEᵣ + ½bᵣEᵣ²`` over both ends, summed in
    float64 and returned as float32, gradients per layer (``(out, in)`` weights, ``(out,)`` biases, None where a layer
    has no bias) in the network's dtype, the energies and loss float32.

    States: float32, bfloat16 or float16 as the chain takes them; the ends' energies are those of ``x'`` as stored
    (rounded to the state's dtype). ``precision``, ``block_n``, ``num_warps``: as :func:`feedforward_langevin_chain`'s.

    The weight gradient is a sum over chains. Each program stores its block's sums at the starts and at the ends in
    slots of its own of a ``(2·programs, P)`` float32 buffer (``P``: the padded parameters, about 5,300 for a
    2-64-64-1 network), which one ``torch.sum`` over the slots then adds: deterministic (the same bits for the same
    chain count and block size, where atomic adds would change with the order the programs finish in), no
    synchronisation between programs, and each program writes each of its two slots once (at its first and its last
    pass). The
    buffer costs ``8·P/block_n`` bytes per chain (2.7 KB for that network at 16 chains per program, IEEE products'
    default: the order of the activations that autograd keeps for the same loss); a larger ``block_n`` makes it
    smaller."""
    what = "feedforward_contrastive_chain"
    _check(x, network, n_steps, what, min_steps=1)
    _check_block(block_n, what)
    _check_warps(num_warps, what)
    seed64, offset = _stream_arguments(seed, offset)
    n, device = x.shape[0], x.device
    a, b = _coefficients((start, end), n, device)
    tensors, padded, acts = kernel_arguments(network, device)
    output = network.layers[-1].linear
    bo = torch.zeros(1, dtype=torch.float32, device=device)  # the output bias times the sign, read by the kernel
    if output.bias is not None:
        bo.copy_(output.bias.detach().reshape(1)).mul_(network.sign)
    if n:
        h, hv = _per_chain(step_size, n, device, "step_size")
        s, sv = _per_chain(noise_scale, n, device, "noise_scale")
        xs = x.detach()
        if xs.stride(1) != 1:
            xs = xs.contiguous()
        products = _matmul_precision(precision)
        block_n, num_warps = _launch(padded, products, True, block_n, num_warps)
        with torch.no_grad():
            result, energies, sums = _CONTRASTIVE_OP(
                xs,
                tensors,
                list(padded),
                list(acts),
                n_steps,
                h,
                s,
                hv,
                sv,
                seed64,
                offset,
                products,
                block_n,
                num_warps,
                a,
                b,
                bo,
            )
    else:
        result = torch.empty_like(x, memory_format=torch.contiguous_format)
        energies = torch.empty(2, n, dtype=torch.float32, device=device)
        sums = torch.zeros(_partial_size(padded), dtype=torch.float32, device=device)
    e64 = energies.double()
    b64 = torch.zeros_like(e64) if b is None else b.double()
    loss = (e64 * (a.double() + 0.5 * b64 * e64)).sum().float()
    c_sum = (a.double() + torch.where(b64 == 0, 0.0, b64 * e64)).sum()
    weight_grads: list[Tensor] = []
    bias_grads: list[Optional[Tensor]] = []
    at = 0
    for l, layer in enumerate(network.hidden):
        weight = layer.linear.weight
        rows, cols = padded[l + 1], padded[l]
        weight_grads.append(
            sums[at : at + rows * cols].view(rows, cols)[: weight.shape[0], : weight.shape[1]].to(weight.dtype).contiguous()
        )
        at += rows * cols
        bias = layer.linear.bias
        bias_grads.append(None if bias is None else sums[at : at + weight.shape[0]].to(bias.dtype))
        at += rows
    top = output.weight
    weight_grads.append((sums[at : at + top.shape[1]] * network.sign).view(1, -1).to(top.dtype))
    bias_grads.append(None if output.bias is None else (c_sum * network.sign).reshape(1).to(output.bias.dtype))
    return result, energies[0], energies[1], loss, weight_grads, bias_grads


def _partial_size(padded: tuple[int, ...]) -> int:
    """The floats of one slot of the contrastive kernel's partial sums, for padded widths ``(d, h_1, …)``: per hidden
    layer ``h_l × h_{l−1}`` weights and ``h_l`` biases, then the ``h_L`` output weights."""
    return sum(padded[l + 1] * (padded[l] + 1) for l in range(len(padded) - 1)) + padded[-1]


def stream_normals(n: int, d: int, seed: int, step: int, device: Any = "cuda") -> Tensor:
    """The normals ``ξ: (n, d)`` float32 of step ``step`` that the chain adds, drawn by the same Triton code (equal to
    the chain's noise to the bit; to ``ebm_cuda.reference.normal(n, d, seed, step)`` to float32 rounding)."""
    out = torch.empty(n, d, dtype=torch.float32, device=device)
    if n and d:
        with _on(out.device):
            _kernels().launch_normals(out, int(seed), int(step))
    return out


def _on(device: torch.device) -> Any:
    """``torch.cuda.device(device)`` for a CUDA device (the kernel must launch on the inputs' GPU), else nothing."""
    import contextlib

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def compile_report(
    capability: int,
    *,
    widths: tuple[int, ...] = (2, 64, 64),
    activations: tuple[int, ...] | None = None,
    block_n: Optional[int] = None,
    precision: str = "ieee",
    dtype: torch.dtype = torch.float32,
    noise_from_tensor: bool = False,
    per_chain: bool = False,
    num_warps: Optional[int] = None,
    contrastive: bool = False,
    has_b: bool = True,
) -> dict[str, Any]:
    """Compile the chain kernel for ``sm_<capability>`` without a GPU (``triton.compile`` for ``GPUTarget("cuda",
    capability, 32)``) and report what :func:`ebm_cuda.kernel_report.ptxas_report` reads from its ``ptxas -v`` and
    machine code: ``{"registers", "spill_stores", "spill_loads", "stack", "shared", "seconds", "loop_instructions",
    "per_chain_step"}`` (bytes but registers; the step loop's instructions per warp, and warp-instructions per
    chain-step), plus the ``"block_n"`` and ``"num_warps"`` compiled. ``widths``: ``(d, h_1, …)`` before padding;
    ``activations``: codes of :data:`ACTIVATIONS` per hidden layer (SiLU everywhere by default); ``noise_from_tensor``,
    ``per_chain``: the variants that read the noise from a tensor and the step sizes and noise scales per chain;
    ``contrastive``: the kernel of :func:`feedforward_contrastive_chain` (``has_b``: with quadratic coefficients ``b``);
    ``block_n``, ``num_warps``: None for the launchers' choice (:func:`launch_config`)."""
    fn = _kernels().langevin_kernel
    padded = [_pad(w) for w in widths]
    n_hidden = len(widths) - 1
    acts = list(activations if activations is not None else (0,) * n_hidden)
    block_n, warps = _launch(tuple(padded), precision, contrastive, block_n, num_warps)
    element = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    signature: dict[str, str] = {
        name: "*fp32"
        for name in (
            "noise_ptr",
            "hv_ptr",
            "sv_ptr",
            "w1_ptr",
            "b1_ptr",
            "w2_ptr",
            "b2_ptr",
            "w3_ptr",
            "b3_ptr",
            "wo_ptr",
            "a_ptr",
            "b_ptr",
            "bo_ptr",
            "e_ptr",
            "part_ptr",
        )
    }
    signature.update(
        x_ptr=f"*{element}",
        out_ptr=f"*{element}",
        n="i32",
        d="i32",
        stride_x="i32",
        stride_out="i32",
        n_steps="i32",
        h="fp32",
        s="fp32",
        seed_lo="i32",
        seed_hi="i32",
        offset_lo="i32",
        offset_hi="i32",
    )
    constexprs = dict(
        D0=padded[0],
        DN=_kernels().noise_columns(widths[0], padded[0], block_n),
        H1=padded[1],
        H2=(padded + [16, 16])[2],
        H3=(padded + [16, 16, 16])[3],
        N_HIDDEN=n_hidden,
        ACT1=acts[0],
        ACT2=(acts + [0, 0])[1],
        ACT3=(acts + [0, 0, 0])[2],
        BLOCK_N=block_n,
        NOISE_FROM_TENSOR=noise_from_tensor,
        PER_CHAIN_H=per_chain,
        PER_CHAIN_S=per_chain,
        PRECISION=precision,
        CONTRASTIVE=contrastive,
        HAS_B=contrastive and has_b,
        P=_partial_size(tuple(padded)) if contrastive else 1,
        PTX_MATH=True,
    )
    report = ptxas_report(fn, signature, constexprs, capability, warps, chains_per_program=block_n)
    return dict(report, block_n=block_n, num_warps=warps)


def normals_compile_report(capability: int, *, d: int = 16) -> dict[str, Any]:
    """:func:`compile_report` for the kernel of :func:`stream_normals` (``d`` columns, padded as the chain pads them)."""
    fn = _kernels().normals_kernel
    signature = dict(out_ptr="*fp32", n="i32", d="i32", seed_lo="i32", seed_hi="i32", step_lo="i32", step_hi="i32")
    return dict(ptxas_report(fn, signature, dict(D=_pad(d), BLOCK_N=16), capability, 4), block_n=16, num_warps=4)
