"""What the network ops share: the checks of a network's layers and states, the C description of the layers
(``n_hidden, widths, weights, biases, activations, sign``: :data:`NETWORK_ARGTYPES`), the buffers of the weight
gradients, the losses' launch, and a program's layers as the ops take them (:func:`layers`) with the reason the host
build cannot run one (:func:`network_refusal`). The ops: :mod:`ebm_cuda.feedforward_ops`, :mod:`ebm_cuda.contrastive_op`,
:mod:`ebm_cuda.conv_ops`.
"""

from __future__ import annotations

import ctypes
from ctypes import c_double, c_int, c_void_p
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ebmcore.energies.program import FeedForward
from ebmcore.errors import InputError
from ebmcore.kernels.base import Kernel
from ebm_cuda.activations import activation_code, activation_refusal
from ebm_cuda.dispatch import _HOST_ONLY_FIX, _chain_run, _check, _run_host

__all__ = ["NETWORK_ARGTYPES", "layers", "network_refusal", "host_kernel", "eager_host"]

NETWORK_ARGTYPES = (c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_double)
"""The ctypes arguments a feed-forward C function starts with: ``n_hidden``, ``widths``, ``weights``, ``biases``,
``activations`` (:func:`ebm_cuda.activations.activation_code`'s, one per hidden layer), ``sign``."""


def network_refusal(network: FeedForward) -> Optional[str]:
    """Why the host build's ``feedforward_*`` kernels cannot run ``network`` (None: they can)."""
    if not network.hidden:
        return "needs a hidden layer (this energy is linear)"
    return activation_refusal(layer.activation for layer in network.hidden)


def layers(network: FeedForward) -> tuple[list[Tensor], list[Optional[Tensor]], list[int], float]:
    """A feed-forward program as the network ops take it: weights, biases, activation codes, sign."""
    return (
        [layer.weight for layer in network.layers],
        [layer.bias for layer in network.layers],
        [activation_code(layer.activation) for layer in network.hidden],
        float(network.sign),
    )


def host_kernel(op: str, fn: Callable[..., Any], refuses: Callable[..., Optional[str]] = network_refusal) -> Kernel:
    """The ``cpu_fused`` backend's kernel ``op``: ``fn`` on float32 CPU states, ranked above the per-step loop (10)."""
    return Kernel(op, fn, ("cpu",), (torch.float32,), None, 10, refuses=refuses)


def _network_shapes(
    what: str, x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int]
) -> None:
    """Check that the layers chain from ``x: (n, d)`` to one output."""
    n_hidden = len(weights) - 1
    if n_hidden < 1 or len(biases) != len(weights) or len(activations) != n_hidden:
        raise InputError(
            f"ebm_cuda.{what}: give at least two layers, one bias (or None) per layer and one "
            f"activation per hidden layer; got {len(weights)} weights, {len(biases)} biases, {len(activations)} activations."
        )
    width = x.shape[1]
    for l, w in enumerate(weights):
        if w.dim() != 2 or w.shape[1] != width or (l == n_hidden and w.shape[0] != 1):
            raise InputError(
                f"ebm_cuda.{what}: weights[{l}] of shape {tuple(w.shape)} does not follow width "
                f"{width}" + (" into one output" if l == n_hidden else "") + "."
            )
        if biases[l] is not None and biases[l].shape != (w.shape[0],):
            raise InputError(
                f"ebm_cuda.{what}: biases[{l}] of shape {tuple(biases[l].shape)} does not fit weights[{l}] {tuple(w.shape)}."
            )
        width = w.shape[0]


def _float32(t: Tensor) -> Tensor:
    """``t`` as a contiguous float32 tensor the kernels read (itself when it is one already: no copy)."""
    return t if t.dtype == torch.float32 and t.is_contiguous() else t.detach().to(torch.float32).contiguous()


_DESCRIBED: dict[tuple, tuple] = {}
""":func:`_network`'s C descriptions, by what they hold: the widths, the weight and bias pointers and the activation
codes (a description is a function of these alone, so one found here is the one that would be built; the tensors it
points into are the caller's, alive for the call). A network trained in place keeps its pointers: one entry per
network and dtype, built once."""

_DESCRIBED_MAX = 64  # cleared when full: a caller that swaps its weights on every call builds each anew


def _network(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int]) -> tuple[tuple, list]:
    """The C description ``(n_hidden, widths, weight pointers, bias pointers, activation codes)`` of checked layers,
    and the float32 tensors it points into (keep them alive)."""
    keep = [_float32(w) for w in weights]
    bias_tensors = [None if b is None else _float32(b) for b in biases]
    widths = (keep[0].shape[1], *(w.shape[0] for w in keep))
    weight_ptrs = tuple(t.data_ptr() for t in keep)
    bias_ptrs = tuple(None if b is None else b.data_ptr() for b in bias_tensors)
    key = (widths, weight_ptrs, bias_ptrs, tuple(activations))
    described = _DESCRIBED.get(key)
    if described is None:
        described = (
            len(weights) - 1,
            (ctypes.c_int64 * len(widths))(*widths),
            (ctypes.c_void_p * len(weight_ptrs))(*weight_ptrs),
            (ctypes.c_void_p * len(bias_ptrs))(*bias_ptrs),
            (ctypes.c_int64 * len(key[3]))(*key[3]),
        )
        if len(_DESCRIBED) >= _DESCRIBED_MAX:
            _DESCRIBED.clear()
        _DESCRIBED[key] = described
    return described, keep + [b for b in bias_tensors if b is not None]


def _weight_gradients(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]]
) -> tuple[list[Tensor], list[Optional[Tensor]], tuple]:
    """Buffers on ``x``'s device for a kernel's weight and hidden-bias gradients (None where a layer has no bias), and
    their C pointer arrays."""
    device = x.device  # read once: each read makes an object
    grad_w = [torch.empty(w.shape, dtype=torch.float32, device=device) for w in weights]
    grad_b = [None if t is None else torch.empty(t.shape, dtype=torch.float32, device=device) for t in biases[:-1]]
    return (
        grad_w,
        grad_b,
        (
            (ctypes.c_void_p * len(grad_w))(*(g.data_ptr() for g in grad_w)),
            (ctypes.c_void_p * len(grad_b))(*(None if g is None else g.data_ptr() for g in grad_b)),
        ),
    )


def _network_input(
    x: Tensor,
    what: str,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    noun: str = "inputs",
) -> Tensor:
    """``x: (n, d)`` checked for a network kernel: float32 on the CPU, and layers that chain from ``d`` to one output."""
    x = _check(x, what)
    if not x.is_cpu or x.dtype != torch.float32:
        raise InputError(f"ebm_cuda.{what}: float32 {noun} on the CPU only, got {x.dtype} on {x.device}. {_HOST_ONLY_FIX}")
    _network_shapes(what, x, weights, biases, activations)
    return x


def _chain_input(
    x: Tensor,
    what: str,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    n_steps: int,
    min_steps: int,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """The checked states of a network chain (float32 on the CPU, layers that chain, ``n_steps >= min_steps``, a valid
    stream position) and its per-chain step sizes and noise scales (None: the scalars)."""
    x = _network_input(x, what, weights, biases, activations, noun="states")
    return (x, *_chain_run(what, x, n_steps, min_steps, step_sizes, noise_scales, seed, offset))


def _network_loss(
    what: str,
    name: str,
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Optional[Tensor]],
    activations: Sequence[int],
    sign: float,
    *inputs: object,
) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Run the loss kernel ``name`` (of the op ``what``) on ``inputs``, pointers into ``x`` and tensors on its device:
    ``(loss: (), weight grads, bias grads)`` (no output-bias gradient)."""
    network, keep = _network(weights, biases, activations)
    grad_w, grad_b, pointers = _weight_gradients(x, weights, biases)
    loss = ctypes.c_double(0.0)
    _run_host(what, (x, *keep), name, *network, float(sign), *inputs, ctypes.byref(loss), *pointers, torch.get_num_threads())
    return torch.full((), loss.value, dtype=torch.float32, device=x.device), grad_w, [*grad_b, None]


def eager_host(*tensors: Optional[Tensor]) -> bool:
    """Whether a kernel may call its op's host implementation directly on ``tensors`` (None skipped) rather than
    through ``torch.ops.ebm_cuda`` (whose dispatch, and the ``torch.no_grad()`` around it, cost more than a small
    batch's loss): an eager call on plain tensors that need no gradient, with no ``torch.compile`` trace, no torch
    function or dispatch mode and no functorch transform, each of which must see the op itself (fake tensors,
    FlopCounterMode, vmap). The implementation is the op's, so both give the same values."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._functorch.peek_interpreter_stack() is not None
    ):
        return False
    return all(t is None or (type(t) is Tensor and not t.requires_grad) for t in tensors)


def _present(grads: Sequence[Optional[Tensor]]) -> list[Tensor]:
    return [g for g in grads if g is not None]


def _restored(present: Sequence[Tensor], biases: Sequence[Optional[Tensor]], output_bias: bool) -> list[Optional[Tensor]]:
    """The bias gradients per layer (None where a layer has no bias, and for the output bias unless ``output_bias``)."""
    it = iter(present)
    return [None if b is None else next(it) for b in biases[:-1]] + [next(it) if output_bias and biases[-1] is not None else None]


def _fake_gradients(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], output_bias: bool) -> tuple[list, list]:
    grad_w = [torch.empty(w.shape, dtype=torch.float32, device=w.device) for w in weights]
    kept = [*biases[:-1], *(biases[-1:] if output_bias else [])]
    return grad_w, [torch.empty(b.shape, dtype=torch.float32, device=b.device) for b in kept if b is not None]
