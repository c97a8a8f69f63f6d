"""The feed-forward network ops of the host build: the Langevin chain of a feed-forward energy
(``torch.ops.ebm_cuda.feedforward_langevin_chain``) and the losses' ops with their weight gradients (score matching:
``feedforward_denoising_score_matching``, ``feedforward_sliced_score_matching``; the energies with the gradient of a
loss in them: ``feedforward_energy_gradients``), each one row of :mod:`ebm_cuda.native` with the ``cpu_fused`` kernel
that runs it for a :class:`~ebmcore.energies.program.FeedForward` program. Contrastive divergence's chain is
:mod:`ebm_cuda.contrastive_op`'s, the convolutional chain :mod:`ebm_cuda.conv_ops`'.

The chain's products: the hidden-to-hidden layers' (forward and backward; not the first layer's nor the input
gradient's) are IEEE float32 FMAs, or, where ``precision`` asks for ``"bf16"`` (torch's switch at ``"medium"``, as
for the Triton chains: :func:`host_products`), bfloat16 operands rounded to nearest even and summed in float32
(:data:`BF16_BY` says by which instructions); the activations, the first layer, the input gradient and the move stay
float32. TF32 is a tensor-core format the CPU has not: ``"high"`` and ``"tf32"`` run float32 products here.

The host build runs them (float32, CPU tensors), through :func:`ebm_cuda.dispatch._run_host`: a tensor on another
device is refused with the fix (the Triton kernels, :mod:`ebm_cuda.triton_chains`, run the feed-forward chain on
CUDA). Each has a fake implementation, so ``torch.compile`` traces through it. The noise is the Philox stream's, as in
:func:`ebm_cuda.analytic_ops.langevin_chain`.

The losses' ops take and return tensors (torch.library's schemas take no tuples and return no None in a list), so the
bias gradients travel as those of the layers that have a bias; the public functions take and return what the losses
use.
"""

from __future__ import annotations

from ctypes import c_double, c_int, c_int64, c_uint64, c_void_p
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ebmcore.energies.program import FeedForward
from ebm_cuda.dispatch import _like, _ptr, _run_host, _scalar_or_vector, _vector, call
from ebm_cuda.native import NativeOp, define
from ebm_cuda.triton_launch import products as _asked_products
from ebm_cuda.network_layers import (
    NETWORK_ARGTYPES,
    _chain_input,
    _fake_gradients,
    _network,
    _network_input,
    _network_loss,
    _present,
    _restored,
    _weight_gradients,
    eager_host,
    host_kernel,
    layers,
)

__all__ = [
    "HOST_PRODUCTS",
    "BF16_BY",
    "host_products",
    "bf16_instructions",
    "feedforward_langevin_chain",
    "feedforward_denoising_score_matching",
    "feedforward_sliced_score_matching",
    "feedforward_energy_gradients",
]


HOST_PRODUCTS = ("ieee", "bf16")
"""The products the host chain computes with (names of :data:`ebm_cuda.triton_launch.PRECISIONS`)."""

BF16_BY = "fma"
"""How the host chain's bfloat16 products run: ``"fma"``, float32 FMAs on the operands rounded to bfloat16 (each
product exact in float32, summed in float32), or ``"vdpbf16ps"``, AVX512-BF16 dot products (pairs of products summed
into float32, denormals flushed; only in a build for a CPU with ``avx512_bf16``). Both are the GPU chains'
``"bf16"`` products. FMAs, because on the CPU measured (``benchmarks/results/2026-11-28-cpu-roofline.json``, an Intel
Xeon with avx512_bf16 and no AMX) vdpbf16ps retires 64 FLOP every 2 cycles against two 32-FLOP FMAs every cycle: half
the float32 FMA peak, so W4's chain ran slower with it than with float32 products."""

_PRODUCT_CODES = {"ieee": 0, ("bf16", "fma"): 1, ("bf16", "vdpbf16ps"): 2}
"""``ebm::ff::Products``: the C chain's products codes."""


def host_products(precision: Optional[str]) -> tuple[Optional[str], None]:
    """What the host chain's kernel declares as ``fn.products`` (:func:`ebm_samplers.algorithm.kernel_products`):
    ``precision`` (one of :data:`ebm_cuda.triton_launch.PRECISIONS`; None: what torch's switch
    ``torch.get_float32_matmul_precision()`` asks for, ``"medium"`` bfloat16) -> ``("bf16", None)`` for bfloat16
    products, ``(None, None)`` for the chain's own float32 ones (IEEE; ``"high"``'s and ``"tf32"``'s TF32 is a GPU
    format, ``"tf32x3"`` float32-accurate: float32 here), which a run's path does not name."""
    return ("bf16" if _asked_products(precision) == "bf16" else None), None


def _products_code(precision: str) -> int:
    if precision not in HOST_PRODUCTS:
        precision = "bf16" if _asked_products(precision) == "bf16" else "ieee"
    return _PRODUCT_CODES["ieee" if precision == "ieee" else (precision, BF16_BY)]


def bf16_instructions() -> str:
    """Words for the host chain's bfloat16 products in this build (:data:`BF16_BY`, and whether vdpbf16ps is built)."""
    from ebm_cuda import library

    try:
        library.host().call("feedforward_products", _PRODUCT_CODES[("bf16", "vdpbf16ps")])
        dot = "vdpbf16ps built"
    except Exception as e:  # the build's reason (no avx512_bf16), or no host build
        dot = f"vdpbf16ps not built: {e}"
    how = "float32 FMAs on bfloat16-rounded operands" if BF16_BY == "fma" else "vdpbf16ps"
    return f"bf16 products by {how} ({dot})"


def _feedforward_langevin_chain(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
    n_steps: int,
    step_size: float,
    noise_scale: float,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
    precision: str = "ieee",
) -> Tensor:
    """``n_steps`` Langevin steps of ``E(x) = sign · (W_L f(… f(W_1 x + b_1) …) + b_L)`` in one launch (host build,
    float32). ``weights[l]: (out_l, in_l)`` with ``in_0 = d`` and ``out_L = 1``; ``biases[l]: (out_l,)`` or None;
    ``activations``: one code of :data:`ebm_cuda.activations.ACTIVATION_CODES` per hidden layer. The noise is the stream's, as in
    ``langevin_chain``. ``precision``: the hidden-to-hidden products, ``"ieee"`` (float32) or ``"bf16"`` (bfloat16
    operands summed in float32, :data:`BF16_BY`); the other names of :data:`ebm_cuda.triton_launch.PRECISIONS` as
    :func:`host_products` maps them. Returns the new ``x: (n, d)``."""
    code = _products_code(precision)
    x, hv, sv = _chain_input(
        x, "feedforward_langevin_chain", weights, biases, activations, n_steps, 0, step_sizes, noise_scales, seed, offset
    )
    if n_steps == 0:
        return x.clone()
    network, keep = _network(weights, biases, activations)
    out = torch.empty_like(x)
    _run_host(
        "feedforward_langevin_chain",
        (x, *keep),
        "feedforward_langevin_chain",
        *network,
        float(sign),
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        n_steps,
        step_size,
        noise_scale,
        _ptr(hv),
        _ptr(sv),
        seed,
        offset,
        code,
        torch.get_num_threads(),
    )
    return out


def _feedforward_langevin_chain_fake(
    x,
    weights,
    biases,
    activations,
    sign,
    n_steps,
    step_size,
    noise_scale,
    step_sizes,
    noise_scales,
    seed,
    offset,
    precision="ieee",
):
    return torch.empty_like(x)


def _feedforward_denoising_score_matching_host(
    x: Tensor,
    target: Tensor,
    scale: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Optional[Tensor]], list[Optional[Tensor]]]:
    """``L = (1/2n) Σᵣ |aᵣ∇E(xᵣ) − bᵣ|²`` for the feed-forward energy of ``feedforward_langevin_chain`` (host build,
    float32), with its gradient in every weight and bias, in one pass over tiles of the batch. ``x``, ``target``
    (``b``): ``(n, d)``; ``scale`` (``a``): ``(n,)`` or None for ones. Returns ``(L: (), weight grads, bias grads)``
    (None where a layer has no bias, and for the output bias, which does not move ``∇E``, as autograd leaves it).
    Not an autograd op: the caller attaches the gradients."""
    x = _network_input(x, "feedforward_denoising_score_matching", weights, biases, activations)
    target = _like(target, x, "target")
    scale = None if scale is None else _vector(scale, x, "scale")
    return _network_loss(
        "feedforward_denoising_score_matching",
        "feedforward_dsm",
        x,
        weights,
        biases,
        activations,
        sign,
        x.data_ptr(),
        target.data_ptr(),
        _ptr(scale),
        x.shape[0],
    )


def _feedforward_sliced_score_matching_host(
    x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int], sign: float
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/n) Σᵣ ½(vᵣᵀ∇E(xᵣ))² − vᵣᵀ∇²E(xᵣ)vᵣ`` (sliced score matching, one direction ``vᵣ`` per row) for the
    feed-forward energy of ``feedforward_langevin_chain`` (host build, float32), with its gradient in every weight
    and bias, in one pass: the derivatives along ``v`` carried forwards, then reverse mode through them (no
    Hessian is formed). ``x``, ``v``: ``(n, d)``. Returns what ``feedforward_denoising_score_matching`` does."""
    x = _network_input(x, "feedforward_sliced_score_matching", weights, biases, activations)
    v = _like(v, x, "v")
    return _network_loss(
        "feedforward_sliced_score_matching",
        "feedforward_ssm",
        x,
        weights,
        biases,
        activations,
        sign,
        x.data_ptr(),
        v.data_ptr(),
        x.shape[0],
    )


def _feedforward_energy_gradients_host(
    x: Tensor,
    a: Tensor,
    b: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``E(x): (n,)`` of the feed-forward energy of ``feedforward_langevin_chain`` (host build, float32) and
    ``Σᵣ cᵣ ∂E(xᵣ)/∂θ`` for every weight and bias ``θ``, with ``cᵣ = aᵣ + bᵣ E(xᵣ)`` (``b`` None: zero), in one pass:
    the gradient of a loss linear or quadratic in the energies, ``c = ∂loss/∂E``. ``x: (n, d)``, ``a``, ``b``: ``(n,)``.
    Returns ``(E, weight grads, bias grads)`` (None where a layer has no bias)."""
    x = _network_input(x, "feedforward_energy_gradients", weights, biases, activations)
    a, b = _vector(a, x, "a"), _vector(b, x, "b")
    network, keep = _network(weights, biases, activations)
    energies = x.new_empty(x.shape[0])
    grad_w, grad_b, pointers = _weight_gradients(x, weights, biases)
    out_bias = None if biases[-1] is None else torch.empty(1, dtype=torch.float32, device=x.device)
    _run_host(
        "feedforward_energy_gradients",
        (x, *keep),
        "feedforward_energy_gradient",
        *network,
        float(sign),
        x.data_ptr(),
        a.data_ptr(),
        _ptr(b),
        x.shape[0],
        energies.data_ptr(),
        _ptr(out_bias),
        *pointers,
        torch.get_num_threads(),
    )
    return energies, grad_w, [*grad_b, out_bias]


def _dsm_op(
    x: Tensor,
    target: Tensor,
    scale: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    loss, grad_w, grad_b = _feedforward_denoising_score_matching_host(x, target, scale, weights, biases, activations, sign)
    return loss, grad_w, _present(grad_b)


def _ssm_op(
    x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int], sign: float
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    loss, grad_w, grad_b = _feedforward_sliced_score_matching_host(x, v, weights, biases, activations, sign)
    return loss, grad_w, _present(grad_b)


def _energy_gradients_op(
    x: Tensor,
    a: Tensor,
    b: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    energies, grad_w, grad_b = _feedforward_energy_gradients_host(x, a, b, weights, biases, activations, sign)
    return energies, grad_w, _present(grad_b)


def _dsm_fake(x, target, scale, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


def _ssm_fake(x, v, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


def _energy_gradients_fake(x, a, b, weights, biases, activations, sign):
    return (x.new_empty(x.shape[:1]), *_fake_gradients(weights, biases, True))


def feedforward_denoising_score_matching(
    x: Tensor,
    target: Tensor,
    scale: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/2n) Σᵣ |aᵣ∇E(xᵣ) − bᵣ|²`` for the feed-forward energy of ``feedforward_langevin_chain`` (host build,
    float32), with its gradient in every weight and bias, in one pass over tiles of the batch (the op
    ``torch.ops.ebm_cuda.feedforward_denoising_score_matching``). ``x``, ``target`` (``b``): ``(n, d)``; ``scale``
    (``a``): ``(n,)`` or None for ones. Returns ``(L: (), weight grads, bias grads)`` (None where a layer has no bias,
    and for the output bias, which does not move ``∇E``, as autograd leaves it). Not an autograd op: the caller
    attaches the gradients."""
    loss, grad_w, grad_b = call(
        "feedforward_denoising_score_matching", x, target, scale, list(weights), list(biases), list(activations), float(sign)
    )
    return loss, list(grad_w), _restored(grad_b, biases, False)


def feedforward_sliced_score_matching(
    x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int], sign: float
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/n) Σᵣ ½(vᵣᵀ∇E(xᵣ))² − vᵣᵀ∇²E(xᵣ)vᵣ`` (sliced score matching, one direction ``vᵣ`` per row) with its
    gradient in every weight and bias (the op ``torch.ops.ebm_cuda.feedforward_sliced_score_matching``; see
    ``_feedforward_sliced_score_matching_host``). Returns what :func:`feedforward_denoising_score_matching` does."""
    loss, grad_w, grad_b = call(
        "feedforward_sliced_score_matching", x, v, list(weights), list(biases), list(activations), float(sign)
    )
    return loss, list(grad_w), _restored(grad_b, biases, False)


def feedforward_energy_gradients(
    x: Tensor,
    a: Tensor,
    b: Optional[Tensor],
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``E(x): (n,)`` and ``Σᵣ cᵣ ∂E(xᵣ)/∂θ``, ``cᵣ = aᵣ + bᵣE(xᵣ)`` (the op ``torch.ops.ebm_cuda.feedforward_energy_gradients``;
    see ``_feedforward_energy_gradients_host``). Returns ``(E, weight grads, bias grads)`` (None where a layer has no
    bias)."""
    energies, grad_w, grad_b = call(
        "feedforward_energy_gradients", x, a, b, list(weights), list(biases), list(activations), float(sign)
    )
    return energies, list(grad_w), _restored(grad_b, biases, True)


def _langevin_chain_kernel(
    x: Tensor,
    network: FeedForward,
    *,
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    precision: Optional[str] = None,
) -> Tensor:
    """``n_steps`` Langevin steps of the feed-forward energy ``network``; ``x: (n, d)`` float32. ``precision``: the
    products (:func:`host_products`; None: torch's switch)."""
    h, hv = _scalar_or_vector(step_size)
    s, sv = _scalar_or_vector(noise_scale)
    products = host_products(precision)[0] or "ieee"
    return call("feedforward_langevin_chain", x, *layers(network), n_steps, h, s, hv, sv, seed, offset, products)


_langevin_chain_kernel.products = host_products


def _dsm_kernel(
    x: Tensor, target: Tensor, scale: Optional[Tensor], network: FeedForward
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """:func:`feedforward_denoising_score_matching` of the feed-forward energy ``network`` (eager: its host
    implementation, without the op's dispatch, :func:`~ebm_cuda.network_layers.eager_host`)."""
    if eager_host(x, target, scale):
        return _feedforward_denoising_score_matching_host(x, target, scale, *layers(network))
    return feedforward_denoising_score_matching(x, target, scale, *layers(network))


def _ssm_kernel(x: Tensor, v: Tensor, network: FeedForward) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """:func:`feedforward_sliced_score_matching` of the feed-forward energy ``network`` (eager: as ``_dsm_kernel``)."""
    if eager_host(x, v):
        return _feedforward_sliced_score_matching_host(x, v, *layers(network))
    return feedforward_sliced_score_matching(x, v, *layers(network))


def _energy_gradients_kernel(
    x: Tensor, a: Tensor, b: Optional[Tensor], network: FeedForward
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """:func:`feedforward_energy_gradients` of the feed-forward energy ``network``."""
    return feedforward_energy_gradients(x, a, b, *layers(network))


_CHAIN_ARGTYPES = (c_void_p, c_void_p, c_int64, c_int64, c_double, c_double, c_void_p, c_void_p, c_uint64, c_uint64)
"""A chain's ctypes arguments after the network's: ``x, out, n, n_steps, h, s, hv, sv, seed, offset``."""

define(NativeOp("feedforward_products", symbol="feedforward_products", argtypes=(c_int,), builds=("host",), execution=()))

feedforward_langevin_chain = define(
    NativeOp(
        "feedforward_langevin_chain",
        _feedforward_langevin_chain,
        _feedforward_langevin_chain_fake,
        symbol="feedforward_langevin_chain",
        argtypes=(*NETWORK_ARGTYPES, *_CHAIN_ARGTYPES, c_int),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("feedforward_langevin_chain", _langevin_chain_kernel),
    )
)
define(
    NativeOp(
        "feedforward_denoising_score_matching",
        _dsm_op,
        _dsm_fake,
        symbol="feedforward_dsm",
        argtypes=(*NETWORK_ARGTYPES, c_void_p, c_void_p, c_void_p, c_int64, c_void_p, c_void_p, c_void_p),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("feedforward_denoising_score_matching", _dsm_kernel),
    )
)
define(
    NativeOp(
        "feedforward_sliced_score_matching",
        _ssm_op,
        _ssm_fake,
        symbol="feedforward_ssm",
        argtypes=(*NETWORK_ARGTYPES, c_void_p, c_void_p, c_int64, c_void_p, c_void_p, c_void_p),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("feedforward_sliced_score_matching", _ssm_kernel),
    )
)
define(
    NativeOp(
        "feedforward_energy_gradients",
        _energy_gradients_op,
        _energy_gradients_fake,
        symbol="feedforward_energy_gradient",
        argtypes=(*NETWORK_ARGTYPES, c_void_p, c_void_p, c_void_p, c_int64, c_void_p, c_void_p, c_void_p, c_void_p),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("feedforward_energy_gradients", _energy_gradients_kernel),
    )
)
