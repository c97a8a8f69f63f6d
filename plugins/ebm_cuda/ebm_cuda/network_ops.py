"""The network ops: Langevin chains of feed-forward energies (``torch.ops.ebm_cuda.feedforward_langevin_chain``) and
of convolutional ones (``conv_langevin_chain``), and the losses' ops with their weight gradients (score matching,
``feedforward_denoising_score_matching`` and ``feedforward_sliced_score_matching``; the energies with the gradient of a
loss in them, ``feedforward_energy_gradients``; contrastive divergence's chain, ``feedforward_contrastive_chain``).

The host build runs them (float32, CPU tensors), through :func:`ebm_cuda.dispatch._run_host`: a tensor on another
device is refused with the fix (the Triton kernels, :mod:`ebm_cuda.triton_chains`, run the feed-forward chain and the
contrastive chain on CUDA). Each has a fake implementation, so ``torch.compile`` traces through it. The noise is the
Philox stream's, as in :func:`ebm_cuda.analytic_ops.langevin_chain`.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebm_cuda.dispatch import _HOST_ONLY_FIX, _chain_run, _check, _like, _op, _ptr, _run_host, _vector, call

__all__ = [
    "feedforward_langevin_chain",
    "conv_langevin_chain",
    "feedforward_denoising_score_matching",
    "feedforward_sliced_score_matching",
    "feedforward_energy_gradients",
    "feedforward_contrastive_chain",
]


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


def _network(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int]) -> tuple[tuple, list]:
    """The C description ``(n_hidden, widths, weight pointers, bias pointers, activation codes)`` of checked layers,
    and the float32 tensors it points into (keep them alive)."""
    keep = [_float32(w) for w in weights]
    bias_tensors = [None if b is None else _float32(b) for b in biases]
    widths = [keep[0].shape[1], *(w.shape[0] for w in keep)]
    described = (
        len(weights) - 1,
        (ctypes.c_int64 * len(widths))(*widths),
        (ctypes.c_void_p * len(keep))(*(t.data_ptr() for t in keep)),
        (ctypes.c_void_p * len(bias_tensors))(*(None if b is None else b.data_ptr() for b in bias_tensors)),
        (ctypes.c_int * len(activations))(*activations),
    )
    return described, keep + [b for b in bias_tensors if b is not None]


def _weight_gradients(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]]
) -> tuple[list[Tensor], list[Optional[Tensor]], tuple]:
    """Buffers on ``x``'s device for a kernel's weight and hidden-bias gradients (None where a layer has no bias), and
    their C pointer arrays."""
    grad_w = [torch.empty(w.shape, dtype=torch.float32, device=x.device) for w in weights]
    grad_b = [None if t is None else torch.empty(t.shape, dtype=torch.float32, device=x.device) for t in biases[:-1]]
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
    if x.device.type != "cpu" or x.dtype != torch.float32:
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
    return torch.tensor(loss.value, dtype=torch.float32, device=x.device), grad_w, [*grad_b, None]


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
) -> Tensor:
    """``n_steps`` Langevin steps of ``E(x) = sign · (W_L f(… f(W_1 x + b_1) …) + b_L)`` in one launch (host build,
    float32). ``weights[l]: (out_l, in_l)`` with ``in_0 = d`` and ``out_L = 1``; ``biases[l]: (out_l,)`` or None;
    ``activations``: one code of :data:`ebm_cuda.activations.ACTIVATION_CODES` per hidden layer. The noise is the stream's, as in
    ``langevin_chain``. Returns the new ``x: (n, d)``."""
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
        torch.get_num_threads(),
    )
    return out


feedforward_langevin_chain = _op("feedforward_langevin_chain", _feedforward_langevin_chain)


@torch.library.register_fake("ebm_cuda::feedforward_langevin_chain")
def _(x, weights, biases, activations, sign, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
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


# The losses' ops, each through torch.ops.ebm_cuda like the chains: tensors in and out (torch.library's schemas take no
# tuples and return no None in a list), so the bias gradients travel as those of the layers that have a bias, and
# (a, b) pairs as two arguments; the public functions below take and return what the losses use.


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


_op("feedforward_denoising_score_matching", _dsm_op)
_op("feedforward_sliced_score_matching", _ssm_op)
_op("feedforward_energy_gradients", _energy_gradients_op)
_op("feedforward_contrastive_chain", _contrastive_chain_op)


@torch.library.register_fake("ebm_cuda::feedforward_denoising_score_matching")
def _(x, target, scale, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


@torch.library.register_fake("ebm_cuda::feedforward_sliced_score_matching")
def _(x, v, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


@torch.library.register_fake("ebm_cuda::feedforward_energy_gradients")
def _(x, a, b, weights, biases, activations, sign):
    return (x.new_empty(x.shape[:1]), *_fake_gradients(weights, biases, True))


@torch.library.register_fake("ebm_cuda::feedforward_contrastive_chain")
def _(
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


conv_langevin_chain = _op("conv_langevin_chain", _conv_langevin_chain)


@torch.library.register_fake("ebm_cuda::conv_langevin_chain")
def _(x, weights, biases, strides, activation, sign, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)
