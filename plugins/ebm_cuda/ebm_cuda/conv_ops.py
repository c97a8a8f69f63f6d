"""The Langevin chain of a convolutional energy on the host build (``torch.ops.ebm_cuda.conv_langevin_chain``): one row
of :mod:`ebm_cuda.native` with the ``cpu_fused`` kernel that runs it for a
:class:`~ebmcore.energies.program.ConvStack` program (float32, CPU tensors; a tensor on another device is refused
with the fix). The noise is the Philox stream's, as in :func:`ebm_cuda.analytic_ops.langevin_chain`.
"""

from __future__ import annotations

import ctypes
from ctypes import c_double, c_int, c_int64, c_uint64, c_void_p
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ebmcore.energies.program import ConvStack
from ebmcore.errors import InputError
from ebm_cuda.activations import activation_code, activation_refusal
from ebm_cuda.dispatch import _HOST_ONLY_FIX, _chain_run, _ptr, _run_host, _scalar_or_vector, call
from ebm_cuda.native import NativeOp, define
from ebm_cuda.network_layers import _network, host_kernel

__all__ = ["conv_langevin_chain"]


def _conv_langevin_chain(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    strides: Sequence[int],
    activation: int,
    sign: float,
    n_steps: int,
    step_size: float,
    noise_scale: float,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
) -> Tensor:
    """``n_steps`` Langevin steps of the convolutional energy ``E(x) = sign · (w · mean_p f(conv_L(… f(conv_1(x)) …)) + b)``
    in one launch (host build, float32): ``x: (n, C, H, W)``; ``weights[l]: (C_{l+1}, C_l, 3, 3)`` for each 3×3
    convolution (padding 1, stride ``strides[l]``) and ``weights[-1]: (1, C_L)`` the head; ``biases[l]: (C_{l+1},)`` or
    None (the head's is unused: it does not move ``∇E``); ``activation``: a code of :data:`ebm_cuda.activations.ACTIVATION_CODES`
    after every convolution. The noise is the stream's for element ``j`` of the flattened image (C-order), as in
    ``langevin_chain``. Returns the new ``x``."""
    if x.dim() != 4:
        raise InputError(f"ebm_cuda.conv_langevin_chain: x must be (n, C, H, W), got shape {tuple(x.shape)}.")
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise InputError(
            f"ebm_cuda.conv_langevin_chain: float32 states on the CPU only, got {x.dtype} on {x.device}. {_HOST_ONLY_FIX}"
        )
    hv, sv = _chain_run("conv_langevin_chain", x, n_steps, 0, step_sizes, noise_scales, seed, offset)
    n_layers = len(weights) - 1
    channels = [x.shape[1]]
    if n_layers < 1 or len(biases) != len(weights) or len(strides) != n_layers:
        raise InputError(
            f"ebm_cuda.conv_langevin_chain: give at least one convolution and the head, one bias (or None) per "
            f"layer and one stride per convolution; got {len(weights)} weights, {len(biases)} biases, "
            f"{len(strides)} strides."
        )
    for l, w in enumerate(weights):
        fits = w.shape == (1, channels[-1]) if l == n_layers else (w.dim() == 4 and w.shape[1:] == (channels[-1], 3, 3))
        if not fits:
            raise InputError(
                f"ebm_cuda.conv_langevin_chain: weights[{l}] of shape {tuple(w.shape)} does not follow "
                f"{channels[-1]} channels"
                + (" into one output (1, C)." if l == n_layers else " (a 3×3 kernel: (C_out, C_in, 3, 3)).")
            )
        if l < n_layers and biases[l] is not None and biases[l].shape != (w.shape[0],):
            raise InputError(
                f"ebm_cuda.conv_langevin_chain: biases[{l}] of shape {tuple(biases[l].shape)} does not fit "
                f"weights[{l}] {tuple(w.shape)}."
            )
        channels.append(w.shape[0])
    x = x.contiguous()
    if n_steps == 0:
        return x.clone()
    # the C description of the layers: channels C_0 .. C_L (then the head's 1), weights, biases (the head's unused)
    (_, channel_array, weight_ptrs, bias_ptrs, activation_codes), keep = _network(weights, biases, [activation] * n_layers)
    out = torch.empty_like(x)
    _run_host(
        "conv_langevin_chain",
        (x, *keep),
        "conv_langevin_chain",
        n_layers,
        channel_array,
        x.shape[2],
        x.shape[3],
        (ctypes.c_int * n_layers)(*strides),
        weight_ptrs,
        bias_ptrs,
        activation_codes,
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
        torch.get_num_threads(),
    )
    return out


def _conv_langevin_chain_fake(
    x, weights, biases, strides, activation, sign, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset
):
    return torch.empty_like(x)


def _conv_refusal(stack: ConvStack) -> Optional[str]:
    """Why ``conv_langevin_chain`` cannot run ``stack``."""
    refusal = activation_refusal([stack.activation])
    if refusal is not None:
        return refusal
    if any(w.dtype != torch.float32 for w in stack.weights):
        return "takes float32 weights"
    return None


def _conv_langevin_chain_kernel(
    x: Tensor, stack: ConvStack, *, n_steps: int, step_size: Any, noise_scale: Any, seed: int, offset: int
) -> Tensor:
    """``n_steps`` Langevin steps of the convolutional energy ``stack``; ``x: (n, C, H, W)`` float32."""
    h, hv = _scalar_or_vector(step_size)
    s, sv = _scalar_or_vector(noise_scale)
    return call(
        "conv_langevin_chain",
        x,
        [*stack.weights, stack.head.weight],
        [*stack.biases, stack.head.bias],
        list(stack.strides),
        activation_code(stack.activation),
        1.0,
        n_steps,
        h,
        s,
        hv,
        sv,
        seed,
        offset,
    )


conv_langevin_chain = define(
    NativeOp(
        "conv_langevin_chain",
        _conv_langevin_chain,
        _conv_langevin_chain_fake,
        symbol="conv_langevin_chain",
        argtypes=(
            *(c_int, c_void_p, c_int, c_int, c_void_p),  # n_layers, channels, height, width, strides
            *(c_void_p, c_void_p, c_void_p, c_double),  # weights, biases, activations, sign
            *(c_void_p, c_void_p, c_int64, c_int64, c_double, c_double, c_void_p, c_void_p, c_uint64, c_uint64),
        ),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("conv_langevin_chain", _conv_langevin_chain_kernel, _conv_refusal),
    )
)
