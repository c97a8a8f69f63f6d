"""Contrastive divergence's chain on the host build (``torch.ops.ebm_cuda.feedforward_contrastive_chain``): the moves of
:func:`ebm_cuda.feedforward_ops.feedforward_langevin_chain` with the energies at the starts and the ends, the loss
and its weight gradient, in one launch; one row of :mod:`ebm_cuda.native` with its ``cpu_fused`` kernel. The Triton
kernel of the same op is :mod:`ebm_cuda.triton_contrastive`'s.
"""

from __future__ import annotations

from ctypes import c_void_p
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ebmcore.energies.program import FeedForward
from ebm_cuda.dispatch import _ptr, _run_host, _scalar_or_vector, _vector, call
from ebm_cuda.feedforward_ops import _CHAIN_ARGTYPES
from ebm_cuda.native import NativeOp, define
from ebm_cuda.network_layers import (
    NETWORK_ARGTYPES,
    _chain_input,
    _fake_gradients,
    _network,
    _present,
    _restored,
    _weight_gradients,
    host_kernel,
    layers,
)

__all__ = ["feedforward_contrastive_chain"]


def _feedforward_contrastive_chain_host(
    x: Tensor,
    start: tuple[Tensor, Optional[Tensor]],
    end: tuple[Tensor, Optional[Tensor]],
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Contrastive divergence's chains, loss and weight gradient in one launch (host build, float32): the ``n_steps >= 1``
    moves of :func:`feedforward_langevin_chain` from ``x: (n, d)`` (the same states, to the bit), and, as
    :func:`feedforward_energy_gradients` computes them, the energies at the starts and the ends, the loss
    ``L = Σᵣ aᵣEᵣ + ½bᵣEᵣ²`` over both (in float64, returned as float32) and its gradient ``Σᵣ cᵣ ∂E(xᵣ)/∂θ``,
    ``c = a + b·E``, for ``start = (a, b)`` at the starts and ``end = (a, b)`` at the ends (``(n,)`` each, ``b`` None:
    zero). The first move reuses the starts' pass: one gradient fewer than a chain and a separate pass. Returns
    ``(x_end, E(x), E(x_end), L: (), weight grads, bias grads)``."""
    x, hv, sv = _chain_input(
        x, "feedforward_contrastive_chain", weights, biases, activations, n_steps, 1, step_sizes, noise_scales, seed, offset
    )
    (a0, b0), (a1, b1) = [
        (_vector(a, x, f"{name}[0]"), _vector(b, x, f"{name}[1]")) for name, (a, b) in (("start", start), ("end", end))
    ]
    network, keep = _network(weights, biases, activations)
    out, loss = torch.empty_like(x), x.new_empty(())
    e0, e1 = x.new_empty(x.shape[:1]), x.new_empty(x.shape[:1])  # two tensors: an op's outputs may not alias
    out_bias = None if biases[-1] is None else torch.empty(1, dtype=torch.float32, device=x.device)
    grad_w, grad_b, pointers = _weight_gradients(x, weights, biases)
    _run_host(
        "feedforward_contrastive_chain",
        (x, *keep),
        "feedforward_contrastive_chain",
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
        a0.data_ptr(),
        _ptr(b0),
        a1.data_ptr(),
        _ptr(b1),
        e0.data_ptr(),
        e1.data_ptr(),
        loss.data_ptr(),
        _ptr(out_bias),
        *pointers,
        torch.get_num_threads(),
    )
    return out, e0, e1, loss, grad_w, [*grad_b, out_bias]


def _contrastive_chain_op(
    x: Tensor,
    start_a: Tensor,
    start_b: Optional[Tensor],
    end_a: Tensor,
    end_b: Optional[Tensor],
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
    *head, grad_w, grad_b = _feedforward_contrastive_chain_host(
        x,
        (start_a, start_b),
        (end_a, end_b),
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
    )
    return (*head, grad_w, _present(grad_b))


def _contrastive_chain_fake(
    x,
    start_a,
    start_b,
    end_a,
    end_b,
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
):
    return (
        torch.empty_like(x),
        x.new_empty(x.shape[:1]),
        x.new_empty(x.shape[:1]),
        x.new_empty(()),
        *_fake_gradients(weights, biases, True),
    )


def feedforward_contrastive_chain(
    x: Tensor,
    start: tuple[Tensor, Optional[Tensor]],
    end: tuple[Tensor, Optional[Tensor]],
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Contrastive divergence's chains, loss and weight gradient in one launch (the op
    ``torch.ops.ebm_cuda.feedforward_contrastive_chain``; see ``_feedforward_contrastive_chain_host``): returns
    ``(x_end, E(x), E(x_end), L: (), weight grads, bias grads)``."""
    *head, grad_w, grad_b = call(
        "feedforward_contrastive_chain",
        x,
        start[0],
        start[1],
        end[0],
        end[1],
        list(weights),
        list(biases),
        list(activations),
        float(sign),
        n_steps,
        step_size,
        noise_scale,
        step_sizes,
        noise_scales,
        seed,
        offset,
    )
    return (*head, list(grad_w), _restored(grad_b, biases, True))


def _contrastive_chain_kernel(
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
) -> tuple[Any, ...]:
    """The feed-forward chain's moves with the energy gradients at the starts and the ends, in one launch
    (:func:`feedforward_contrastive_chain`); ``start``, ``end``: ``(a, b)``, floats or ``(n,)`` (``b`` None: zero).
    Returns ``(x', E(x), E(x'), loss Σ aE + ½bE², weight grads, bias grads)``."""
    h, hv = _scalar_or_vector(step_size)
    s, sv = _scalar_or_vector(noise_scale)

    def vector(c: Any) -> Optional[Tensor]:  # a number (or 0-d tensor) for every chain, or (n,) as it is
        return c if c is None or (isinstance(c, Tensor) and c.dim() > 0) else x.new_full(x.shape[:1], float(c))

    return feedforward_contrastive_chain(
        x,
        (vector(start[0]), vector(start[1])),
        (vector(end[0]), vector(end[1])),
        *layers(network),
        n_steps,
        h,
        s,
        hv,
        sv,
        seed,
        offset,
    )


define(
    NativeOp(
        "feedforward_contrastive_chain",
        _contrastive_chain_op,
        _contrastive_chain_fake,
        symbol="feedforward_contrastive_chain",
        argtypes=(*NETWORK_ARGTYPES, *_CHAIN_ARGTYPES, *(c_void_p,) * 10),
        builds=("host",),
        backend="cpu_fused",
        kernel=host_kernel("feedforward_contrastive_chain", _contrastive_chain_kernel),
    )
)
