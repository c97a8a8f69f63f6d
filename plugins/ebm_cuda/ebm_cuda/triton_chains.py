"""The fused Langevin chain of a feed-forward energy on CUDA, written in Triton: ``feedforward_langevin_chain``, and
the same chain with contrastive divergence's energies, loss and weight gradient: ``feedforward_contrastive_chain``.

One program holds ``block_n`` chains (rows; by default :func:`launch_config`'s: the recorded device sweep's fastest
for W4's network, 32 on 8 warps with IEEE products, 64 on 4 with TF32 and bfloat16 ones, elsewhere the configuration
chosen from the machine code, :func:`static_launch_config`) and runs all ``n_steps`` steps on them: per step the forward pass
(``tl.dot`` per layer, the activation and its derivative), the chain rule backwards (``tl.dot`` with the same
weights), and the move ``x ← x − h∇ₓE(x) + s·ξ``. The weights are read once per program; the states once and
written once per launch, whatever ``n_steps`` is. The contrastive chain is the same kernel with one ``tl.constexpr``
more: its passes at the starts (the first step's) and at the ends (one pass more) also give the energies and the
block's part of the weight gradient (:func:`feedforward_contrastive_chain`).

- **Networks:** the :class:`~ebmcore.energies.program.FeedForward` programs of the host build with 1 to
  :data:`MAX_HIDDEN` hidden layers (one kernel specialised per depth and activations through ``tl.constexpr``),
  activations of :data:`ebm_cuda.activations.ACTIVATION_CODES` (the host build's, parameters included), any sign. Every width is padded with zeros to a
  power of 2 of at least 16 (``tl.arange`` takes powers of 2, ``tl.dot`` needs K ≥ 16), at most :data:`MAX_WIDTH`;
  :func:`refusal` says why a network is not taken.
- **Precision:** the state is float32, bfloat16 or float16 (loaded once, the math in float32, rounded to nearest even
  once per launch, when it is stored); the weights are copied to padded float32. The products (:data:`PRECISIONS`)
  are ``precision=``'s, or, with ``precision=None``, the default, those torch's switch for float32 products asks for
  (:func:`ebm_cuda.triton_launch.products`): ``"highest"`` (torch's default) IEEE float32, ``"high"`` TF32,
  ``"medium"`` bfloat16 operands (summed in float32); ``"tf32x3"`` (Triton's split TF32, float32-accurate) by name
  only. The kernel functions declare them (``fn.products(precision) -> (products, why not at fused=None)``): the
  samplers name them in a run's path and rank the chain by them (:data:`TRITON_CHAIN_PRIORITY`). Compiled, the
  activations' exponentials and reciprocals
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

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore.energies import feedforward
from ebmcore.energies.program import FeedForward
from ebmcore.errors import InputError
from ebmcore.kernels.base import Kernel
from ebm_cuda.activations import activation_code, activation_refusal
from ebm_cuda.native import NativeOp, define
from ebm_cuda.triton_launch import (
    MAX_WIDTH,
    MEASURED_LAUNCH,
    PRECISIONS,
    TRITON_VERSION,
    _check_block,
    _check_warps,
    _kernel_precision,
    _kernels,
    _launch,
    _on,
    _pad,
    _per_chain,
    _runs_here,
    _stream_arguments,
    _triton_reason,
    launch_config,
    products,
    static_launch_config,
    unmeasured_reason,
)

__all__ = [
    "MAX_HIDDEN",
    "MAX_WIDTH",
    "DTYPES",
    "MIN_COMPUTE_CAPABILITY",
    "TRITON_VERSION",
    "PRECISIONS",
    "launch_config",
    "static_launch_config",
    "MEASURED_LAUNCH",
    "products",
    "declared_products",
    "refusal",
    "unavailable_reason",
    "TRITON_CHAIN_PRIORITY",
    "feedforward_langevin_chain",
    "stream_normals",
    "kernel_arguments",
    "triton_kernel",
]

MAX_HIDDEN = 3
"""The most hidden layers the kernel is specialised for."""

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The chain states the kernel takes; the math is float32."""

MIN_COMPUTE_CAPABILITY = (8, 0)
"""Ampere or newer: the GPUs the kernel is compiled for in CI (sm_80, sm_90) and the oldest with TF32 products."""

# Measured on an H100 (benchmarks/results/2026-11-27-h100-b11eeb6/T.md, W4: 10^6 chains x 100 steps of 2-64-64-1): the
# chain ran 11.5x eager torch with TF32 products and 14.5x with bfloat16 ones, where the per-step loop's captured graph
# ran 1.01x; with IEEE products 1.01x. So the kernels rank above the per-step loop (10), and the products decide at
# fused=None: those the device sweep measured faster run (triton_launch.MEASURED_FASTER), the others only with
# fused=True (declared_products says why).
TRITON_CHAIN_PRIORITY = 10


def declared_products(contrastive: bool) -> Callable[[Optional[str]], tuple[str, Optional[str]]]:
    """What the kernel functions declare as ``fn.products``: ``precision`` (None: torch's switch) -> ``(products, why
    the kernel with them does not run at fused=None, or None)`` (:func:`ebm_cuda.triton_launch.unmeasured_reason`)."""

    def declared(precision: Optional[str]) -> tuple[str, Optional[str]]:
        chosen = products(precision)
        return chosen, unmeasured_reason(chosen, contrastive)

    return declared


def triton_kernel(op: str, fn: Callable[..., Any]) -> Kernel:
    """The ``triton`` backend's kernel ``op``: ``fn`` on CUDA states of :data:`DTYPES`, for the networks
    :func:`refusal` takes, ranked :data:`TRITON_CHAIN_PRIORITY`."""
    return Kernel(op, fn, ("cuda",), DTYPES, MIN_COMPUTE_CAPABILITY, TRITON_CHAIN_PRIORITY, MAX_WIDTH, refuses=refusal)


def refusal(network: FeedForward) -> Optional[str]:
    """Why the Triton chain cannot run ``network`` (None: it can)."""
    hidden = network.hidden
    if not hidden:
        return "needs a hidden layer (this energy is linear)"
    if len(hidden) > MAX_HIDDEN:
        return f"takes at most {MAX_HIDDEN} hidden layers, the network has {len(hidden)}"
    missing = activation_refusal(layer.activation for layer in hidden)
    if missing:
        return missing
    widest = max(network.widths[:-1])
    if _pad(widest) > MAX_WIDTH:
        return f"takes layers at most {MAX_WIDTH} wide, the network has one {widest} wide"
    return None


def unavailable_reason() -> Optional[str]:
    """Why the Triton kernels cannot run on this machine's CUDA devices (None: they can). Imports triton only where
    torch sees a CUDA device."""
    if torch.version.cuda is None:
        return f"this torch build has no CUDA (torch {torch.__version__}, torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return _triton_reason()


def kernel_arguments(network: FeedForward, device: torch.device) -> tuple[list[Tensor], tuple[int, ...], tuple[int, ...]]:
    """The network as the kernel reads it: ``[W_1, b_1, …, W_H, b_H, sign·w_out]`` padded with zeros to widths of
    16, 32 or 64 (float32, contiguous, on ``device``), the padded widths ``(d, h_1, …, h_H)`` and the activation codes (:func:`ebm_cuda.activations.activation_code`)."""
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
    return tensors, padded, tuple(activation_code(layer.activation) for layer in network.hidden)


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
    out: Optional[Tensor] = None,
    num_warps: Optional[int] = None,
) -> Tensor:
    """``n_steps`` Langevin steps ``x ← x − h∇ₓE(x) + s·ξ`` of the feed-forward energy ``network`` in one launch;
    ``x: (n, d)`` float32, bfloat16 or float16 (math in float32, rounded once at the end). ``step_size``,
    ``noise_scale``: numbers or one value per chain ``(n,)``. ``ξ`` is drawn in the kernel from the stream of the
    module docstring at steps ``offset, …, offset + n_steps − 1``. ``precision``: the products (:data:`PRECISIONS`:
    ``"ieee"``, ``"tf32x3"``, ``"tf32"`` or ``"bf16"``; None: what ``torch.get_float32_matmul_precision()`` asks for,
    ``"highest"`` IEEE, ``"high"`` TF32, ``"medium"`` bfloat16). ``block_n``: chains per
    program (a power of 2, at least 16; the noise and the masking do not depend on it, the products' rounding may, in
    the last bit), and ``num_warps``: warps per program (4, 8 or 16); None: :func:`launch_config`'s, for tuning
    (``benchmarks/triton_sweep.py``). ``out``: an ``(n, d)`` tensor of ``x``'s dtype on ``x``'s device to write into
    (returned)."""
    return _langevin_chain(x, network, None, n_steps, step_size, noise_scale, seed, offset, precision, block_n, out, num_warps)


def _langevin_chain(
    x: Tensor,
    network: FeedForward,
    noise: Optional[Tensor],
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    precision: Optional[str],
    block_n: Optional[int],
    out: Optional[Tensor],
    num_warps: Optional[int],
) -> Tensor:
    """:func:`feedforward_langevin_chain`, or, with ``noise: (n_steps, n, d)``, the same chain adding that tensor's
    normals instead of the stream's (the tests' ``ebm_cuda.testing.triton_chain_with_noise``)."""
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
    chosen = products(precision)
    block_n, num_warps = _launch(padded, chosen, False, block_n, num_warps)
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
            chosen,
            block_n,
            num_warps,
            noise_t,
        )
    return result


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


def _triton_langevin_chain_fake(
    x, out, tensors, padded, acts, n_steps, h, s, hv, sv, seed, offset, precision, block_n, num_warps, noise
):
    return None


_LANGEVIN_OP = define(
    NativeOp(
        "triton_langevin_chain",
        _triton_langevin_chain,
        _triton_langevin_chain_fake,
        mutates_args=("out",),
        backend="triton",
        kernel=triton_kernel("feedforward_langevin_chain", feedforward_langevin_chain),
    )
)
feedforward_langevin_chain.products = declared_products(False)  # type: ignore[attr-defined]


def stream_normals(n: int, d: int, seed: int, step: int, device: Any = "cuda") -> Tensor:
    """The normals ``ξ: (n, d)`` float32 of step ``step`` that the chain adds, drawn by the same Triton code (equal to
    the chain's noise to the bit; to ``ebm_cuda.reference.normal(n, d, seed, step)`` to float32 rounding)."""
    out = torch.empty(n, d, dtype=torch.float32, device=device)
    if n and d:
        with _on(out.device):
            _kernels().launch_normals(out, int(seed), int(step))
    return out
