"""Contrastive divergence's chain on CUDA, written in Triton: the kernel of :mod:`ebm_cuda.triton_chains` with
``CONTRASTIVE`` set, whose passes at the starts (the first step's) and at the ends (one pass more) also give the
energies and the block's part of the weight gradient (:func:`feedforward_contrastive_chain`); its launch is the op
``torch.ops.ebm_cuda.triton_contrastive_chain`` (one row of :mod:`ebm_cuda.native`, with the ``triton`` backend's
kernel ``feedforward_contrastive_chain``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ebmcore.energies.program import FeedForward
from ebmcore.errors import InputError
from ebm_cuda.native import NativeOp, define
from ebm_cuda.triton_chains import _check, declared_products, kernel_arguments, triton_kernel
from ebm_cuda.triton_launch import (
    _check_block,
    _check_warps,
    _kernel_precision,
    _kernels,
    _launch,
    _on,
    _per_chain,
    products,
    _runs_here,
    _stream_arguments,
)

__all__ = ["feedforward_contrastive_chain"]


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


def _triton_contrastive_chain_fake(
    x, tensors, padded, acts, n_steps, h, s, hv, sv, seed, offset, precision, block_n, num_warps, a, b, bo
):
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
    (rounded to the state's dtype). ``precision``, ``block_n``, ``num_warps``: as :func:`feedforward_langevin_chain`'s;
    with bfloat16 products the layers' weight gradients take TF32 products of the bfloat16-rounded operands (the same
    values: a bfloat16 ``tl.dot`` there crashed on an H100, :data:`ebm_cuda.triton_launch.CONTRASTIVE_BF16`), and the
    kernel runs with ``fused=True`` only until a GPU run confirms it.

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
        chosen = products(precision)
        block_n, num_warps = _launch(padded, chosen, True, block_n, num_warps)
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
                chosen,
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


_CONTRASTIVE_OP = define(
    NativeOp(
        "triton_contrastive_chain",
        _triton_contrastive_chain,
        _triton_contrastive_chain_fake,
        backend="triton",
        kernel=triton_kernel("feedforward_contrastive_chain", feedforward_contrastive_chain),
    )
)
feedforward_contrastive_chain.products = declared_products(True)  # type: ignore[attr-defined]
