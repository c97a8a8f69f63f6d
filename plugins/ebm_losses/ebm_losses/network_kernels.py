"""Losses of feed-forward energies computed by a kernel backend (``ebm-cuda``'s host build; its Triton kernels on
CUDA), made differentiable.

A kernel that runs the network itself returns gradients in its weights, not an autograd graph. These helpers
find such a kernel (:func:`network_kernel`) and hand the gradients it computed with the loss to autograd
(:func:`kernel_loss`). Where no kernel runs, the losses differentiate in torch.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ebmcore.energies.program import FeedForward
from ebmcore.errors import BackendUnavailableError, UnknownComponentError
from ebmcore.kernels import Kernel, resolve_kernel

__all__ = ["network_kernel", "kernel_may_run", "kernel_loss"]


def kernel_may_run(x: Tensor) -> bool:
    """Whether a loss kernel may stand in for autograd at inputs ``x``: grad mode on (the kernels compute weight
    gradients), ``x`` not needing a gradient itself, and no autocast (the torch path then runs under it)."""
    return torch.is_grad_enabled() and not x.requires_grad and not torch.is_autocast_enabled(x.device.type)


def network_kernel(op: str, plan: FeedForward, x: Tensor, backend: Optional[str] = None) -> Optional[Kernel]:
    """The kernel of ``op`` for the feed-forward ``plan`` at inputs ``x: (n, d)`` (from ``backend`` only, where given),
    or None where none runs it or it does not pay: another device or dtype, autocast, an activation it lacks, inputs
    that need a gradient themselves, or grad mode off (the kernels compute weight gradients; the torch path then
    computes the value alone)."""
    if not kernel_may_run(x):
        return None
    try:
        kernel = resolve_kernel(op, x.device, x.dtype, backend)
    except (BackendUnavailableError, UnknownComponentError):
        return None
    return None if kernel.refuses is not None and kernel.refuses(plan) else kernel


class _GivenGradients(torch.autograd.Function):
    """A loss value whose gradients in ``params`` a kernel computed with it: backward scales them by the incoming
    gradient. The parameters are saved, so changing them in place before the backward pass, or a second backward
    pass without ``retain_graph``, raises as autograd does. Under ``create_graph=True`` the loss is recomputed by
    ``recompute`` (the torch path) and differentiated with its graph, so higher derivatives stay right."""

    @staticmethod
    def forward(ctx, value: Tensor, grads: list, recompute: Callable[[], Tensor], *params: Tensor) -> Tensor:  # noqa: D102
        ctx.save_for_backward(*params)
        ctx.grads, ctx.recompute = grads, recompute
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output: Tensor):  # noqa: D102
        params = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            with torch.enable_grad():
                loss = ctx.recompute()
            grads = torch.autograd.grad(loss, params, grad_output, create_graph=True, allow_unused=True)
            return (None, None, None, *grads)
        return (None, None, None, *(g * grad_output for g in ctx.grads))


def kernel_loss(
    plan: FeedForward, value: Tensor, grad_w: list[Tensor], grad_b: list[Optional[Tensor]], *, recompute: Callable[[], Tensor]
) -> Tensor:
    """A loss kernel's ``value: ()``, differentiable in the network's weights and biases through the gradients it
    returned with it (``grad_w``, ``grad_b``: per layer, None for an absent bias or one without a gradient).
    ``recompute()``: the same loss by the torch path, for ``create_graph=True``."""
    params, grads = [], []
    for layer, gw, gb in zip(plan.layers, grad_w, grad_b):
        if gw is not None and (weight := layer.weight) is not None:
            params.append(weight)
            grads.append(gw)
        if gb is not None and (bias := layer.bias) is not None:
            params.append(bias)
            grads.append(gb)
    return _GivenGradients.apply(value, grads, recompute, *params)
