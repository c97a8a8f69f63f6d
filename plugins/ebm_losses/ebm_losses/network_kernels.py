"""Losses of feed-forward energies computed by a kernel backend (``ebm-cuda``'s host build), made differentiable.

A kernel that runs the network itself returns gradients in its weights, not an autograd graph. These helpers
find such a kernel (:func:`network_kernel`) and hand the gradients it computed with the loss to autograd
(:func:`kernel_loss`). Where no kernel runs, the losses differentiate in torch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ebmcore.energies import feedforward
from ebmcore.errors import BackendUnavailableError, UnknownComponentError
from ebmcore.kernels import Kernel, resolve_kernel

__all__ = ["network_kernel", "kernel_loss"]


def network_kernel(op: str, plan: feedforward.FeedForward, x: Tensor) -> Optional[Kernel]:
    """The kernel of ``op`` for the feed-forward ``plan`` at inputs ``x: (n, d)``, or None where none runs it (another
    device or dtype, autocast, an activation it lacks, inputs that need a gradient themselves)."""
    if torch.is_autocast_enabled(x.device.type) or (x.requires_grad and torch.is_grad_enabled()):
        return None
    try:
        kernel = resolve_kernel(op, x.device, x.dtype)
    except (BackendUnavailableError, UnknownComponentError):
        return None
    return None if kernel.refuses is not None and kernel.refuses(plan) else kernel


def _pairs(plan: feedforward.FeedForward, grad_w: list[Tensor], grad_b: list[Optional[Tensor]]) -> list[tuple[Tensor, Any]]:
    """(parameter, its gradient) for every weight and bias the network has, in layer order."""
    return [(t, g) for layer, gw, gb in zip(plan.layers, grad_w, grad_b)
            for t, g in ((layer.linear.weight, gw), (layer.linear.bias, gb)) if t is not None]


class _GivenGradients(torch.autograd.Function):
    """A loss value whose gradients in ``params`` a kernel computed with it: backward scales them by the
    incoming gradient (first order only)."""

    @staticmethod
    def forward(ctx, value: Tensor, grads: list, *params: Tensor) -> Tensor:  # noqa: D102
        ctx.grads = grads
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):  # noqa: D102
        if grad_output.device.type == "cpu" and float(grad_output) == 1.0:  # loss.backward(): hand the gradients over
            return (None, None, *ctx.grads)
        return (None, None, *(None if g is None else g * grad_output for g in ctx.grads))


def kernel_loss(plan: feedforward.FeedForward, value: Tensor, grad_w: list[Tensor], grad_b: list[Optional[Tensor]]) -> Tensor:
    """A loss kernel's ``value: ()``, differentiable in the network's weights and biases through the gradients it
    returned with it."""
    pairs = _pairs(plan, grad_w, grad_b)
    return _GivenGradients.apply(value, [g for _, g in pairs], *(t for t, _ in pairs))
