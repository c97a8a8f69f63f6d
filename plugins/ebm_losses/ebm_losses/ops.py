"""The fused ops the losses call, each defined once by its pure-torch reference, whose signature is the op's.

A kernel backend (``ebm-cuda``'s ``cpu_fused`` on the CPU, its ``triton`` for ``feedforward_contrastive_chain`` on
CUDA) registers implementations under these names; the losses resolve them per device and dtype
(:mod:`ebm_losses.network_kernels`) and otherwise run their torch path. Each reference computes what the op returns,
in the inputs' dtype, through autograd: the definition implementations are held to (``plugins/ebm_cuda/tests``). An
implementation that computes in a wider dtype than the states' returns energies and losses in that dtype (the Triton
contrastive chain: float32 for bfloat16 and float16 states, the states themselves in theirs), gradients in the
network's. Gradients come per layer of the ``FeedForward`` program ``network``, weights
``(out, in)`` and biases ``(out,)``; a layer without a bias, and the output layer's bias where it does not move
what is differentiated (``∇ₓE``), has None.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore.energies import feedforward
from ebmcore.energies.program import FeedForward
from ebmcore.kernels.fused import FusedOp

__all__ = ["LOSS_OPS", "denoising_score_matching", "sliced_score_matching", "energy_gradients", "contrastive_chain"]

Gradients = tuple[list[Tensor], list[Optional[Tensor]]]


def _parameters(network: FeedForward) -> list[Tensor]:
    return [t for layer in network.layers for t in (layer.linear.weight, layer.linear.bias) if t is not None]


def _gradients(value: Tensor, network: FeedForward, output_bias: bool) -> Gradients:
    """``∂value/∂θ`` per layer; None for absent biases, and for the output bias unless ``output_bias``."""
    params = _parameters(network)
    grads = iter(torch.autograd.grad(value, params, allow_unused=True, materialize_grads=True))
    weight_grads, bias_grads = [], []
    for i, layer in enumerate(network.layers):
        weight_grads.append(next(grads))
        bias = next(grads) if layer.linear.bias is not None else None
        bias_grads.append(bias if output_bias or i < len(network.layers) - 1 else None)
    return weight_grads, bias_grads


def denoising_score_matching(
    x: Tensor, target: Tensor, scale: Optional[Tensor], network: FeedForward
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/2n) Σᵣ |aᵣ∇E(xᵣ) − bᵣ|²`` with ``a = scale: (n,)`` (None: ones) and ``b = target: (n, d)``, and
    its gradients in the weights and biases."""
    with torch.enable_grad():
        grad = feedforward.score_terms(network, x)[0]
        a = 1.0 if scale is None else scale[:, None]
        loss = 0.5 * (a * grad - target).square().sum() / x.shape[0]
        return (loss.detach(), *_gradients(loss, network, output_bias=False))


def sliced_score_matching(x: Tensor, v: Tensor, network: FeedForward) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/n) Σᵣ ½(vᵣᵀ∇E(xᵣ))² − vᵣᵀ∇²E(xᵣ)vᵣ`` for ``v: (n, d)``, and its gradients in the weights and biases."""
    with torch.enable_grad():
        grad, vhv = feedforward.score_terms(network, x, v)
        loss = (0.5 * (grad * v).sum(-1).square() - vhv).mean()
        return (loss.detach(), *_gradients(loss, network, output_bias=False))


def energy_gradients(
    x: Tensor, a: Tensor, b: Optional[Tensor], network: FeedForward
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """The energies ``E(xᵣ): (n,)`` and ``Σᵣ (aᵣ + bᵣEᵣ) ∂Eᵣ/∂θ`` (``a``, ``b``: ``(n,)``; ``b`` None: zero), the
    weight gradient of ``Σᵣ aᵣEᵣ + ½bᵣEᵣ²``."""
    with torch.enable_grad():
        e = feedforward.forward(network, x)
        value = (a * e).sum() + (0.0 if b is None else (0.5 * b * e.square()).sum())
        return (e.detach(), *_gradients(value, network, output_bias=True))


def contrastive_chain(
    x: Tensor,
    network: FeedForward,
    *,
    chain: Callable[..., Tensor],
    n_steps: int,
    step_size: Any,
    noise_scale: Any,
    seed: int,
    offset: int,
    start: tuple[Any, Any],
    end: tuple[Any, Any],
) -> tuple[Tensor, ...]:
    """``x' = chain(x, network, n_steps=..., ...)`` (``feedforward_langevin_chain``, whose moves and noise stream the op
    repeats; reference only: the op's kernels draw the stream themselves) with, at ``x`` and ``x'``, the energies, the loss ``Σᵣ aᵣEᵣ + ½bᵣEᵣ²`` for ``(a, b) = start`` and
    ``end`` summed over both, and its weight gradient: ``(x', E(x), E(x'), loss, weight grads, bias grads)``."""
    moved = chain(x, network, n_steps=n_steps, step_size=step_size, noise_scale=noise_scale, seed=seed, offset=offset)

    def coefficient(c: Any) -> Optional[Tensor]:
        return None if c is None else torch.as_tensor(c, dtype=x.dtype, device=x.device).expand(x.shape[0])

    with torch.enable_grad():
        e0, e1 = feedforward.forward(network, x), feedforward.forward(network, moved)
        value = x.new_zeros(())
        for e, (a, b) in ((e0, start), (e1, end)):
            value = value + (coefficient(a) * e).sum()
            if b is not None:
                value = value + (0.5 * coefficient(b) * e.square()).sum()
        grads = _gradients(value, network, output_bias=True)
    return (moved, e0.detach(), e1.detach(), value.detach(), *grads)


LOSS_OPS: dict[str, FusedOp] = {
    op.kernel_name(): op
    for op in (
        FusedOp("denoising_score_matching", FeedForward, denoising_score_matching, ()),
        FusedOp("sliced_score_matching", FeedForward, sliced_score_matching, ()),
        FusedOp("energy_gradients", FeedForward, energy_gradients, ()),
        FusedOp("contrastive_chain", FeedForward, contrastive_chain, ("chain",)),
    )
}
"""The losses' fused ops (registered through ``ebm_register_ops``) by the name of their kernels: contrastive
divergence's ``feedforward_energy_gradients`` and ``feedforward_contrastive_chain``, score matching's other two."""
