"""Closed forms of a :class:`~ebmcore.energies.program.FeedForward` program: ``Linear`` and pointwise activations.

``E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x)`` has ``∇ₓE`` in closed form: the forward pass, then the chain
rule backwards with the same ATen kernels autograd would call (``addmm``/``mm`` and ``silu_backward``,
``tanh_backward``, …). Done here on buffers reused from step to step, with no graph and no autograd engine, the
result equals autograd's to the last bit and costs less (see the performance guide, W4). The program comes from
the model's structure (:meth:`ebmcore.EnergyModel.program`), never from tracing its code; anything that is not a
feed-forward program keeps autograd.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.nn import functional as F

from ebmcore.energies.program import Activation, ActivationKind, FeedForward, Opaque, Program
from ebmcore.errors import InputError

__all__ = [
    "ActivationMath",
    "math_of",
    "forward",
    "energy",
    "score_terms",
    "bind",
    "describe",
    "check_layers",
    "refusal",
    "closed_form",
    "why_not",
]

aten = torch.ops.aten

# An activation's arithmetic, twice: as the ATen ops autograd records for it, run into buffers with no graph
# (``forward``, ``backward``: so the sampler's gradient is autograd's exactly), and as differentiable expressions of
# ``z`` and ``f(z)`` for its first and second derivatives (``d1``, ``d2``: for losses that differentiate the gradient).
Forward = Callable[[Tensor, Tensor], Any]
Backward = Callable[[Tensor, Tensor, Tensor, Tensor], Any]
Derivative = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ActivationMath:
    forward: Forward  # (z, out) -> out = f(z), no graph
    backward: Backward  # (grad, z, fz, out) -> out = grad * f'(z), no graph
    apply: Callable[[Tensor], Tensor]  # f(z), differentiable
    d1: Derivative  # (z, fz) -> f'(z), differentiable
    d2: Derivative  # (z, fz) -> f''(z), differentiable


def _silu() -> ActivationMath:
    def d1(z: Tensor, fz: Tensor) -> Tensor:  # s + f(z)(1 − s), with f(z) = z·s
        s = torch.sigmoid(z)
        return s + fz * (1 - s)

    def d2(z: Tensor, fz: Tensor) -> Tensor:  # s(1 − s)(2 + z − 2f(z))
        s = torch.sigmoid(z)
        return (s - s * s) * (2 + z - 2 * fz)

    return ActivationMath(
        lambda z, out: aten.silu.out(z, out=out),
        lambda g, z, fz, out: aten.silu_backward.grad_input(g, z, grad_input=out),
        F.silu,
        d1,
        d2,
    )


def _tanh() -> ActivationMath:
    return ActivationMath(
        lambda z, out: torch.tanh(z, out=out),
        lambda g, z, fz, out: aten.tanh_backward.grad_input(g, fz, grad_input=out),
        torch.tanh,
        lambda z, t: 1 - t * t,
        lambda z, t: -2 * t * (1 - t * t),
    )


def _sigmoid() -> ActivationMath:
    return ActivationMath(
        lambda z, out: torch.sigmoid(z, out=out),
        lambda g, z, fz, out: aten.sigmoid_backward.grad_input(g, fz, grad_input=out),
        torch.sigmoid,
        lambda z, s: s * (1 - s),
        lambda z, s: s * (1 - s) * (1 - 2 * s),
    )


def _relu() -> ActivationMath:
    return ActivationMath(
        lambda z, out: torch.clamp_min(z, 0, out=out),
        lambda g, z, fz, out: out.copy_(aten.threshold_backward(g, z, 0)),
        torch.relu,
        lambda z, fz: (z > 0).to(z.dtype),
        lambda z, fz: torch.zeros_like(z),
    )


def _softplus(beta: float, threshold: float) -> ActivationMath:
    def d1(z: Tensor, fz: Tensor) -> Tensor:  # linear above the threshold, as torch computes it
        return torch.where(z * beta > threshold, torch.ones_like(z), torch.sigmoid(z * beta))

    def d2(z: Tensor, fz: Tensor) -> Tensor:
        s = torch.sigmoid(z * beta)
        return torch.where(z * beta > threshold, torch.zeros_like(z), beta * s * (1 - s))

    return ActivationMath(
        lambda z, out: aten.softplus.out(z, beta, threshold, out=out),
        lambda g, z, fz, out: aten.softplus_backward.grad_input(g, z, beta, threshold, grad_input=out),
        lambda z: F.softplus(z, beta, threshold),
        d1,
        d2,
    )


def _gelu(approximate: str) -> ActivationMath:
    def d1(z: Tensor, fz: Tensor) -> Tensor:
        if approximate == "tanh":
            k = math.sqrt(2 / math.pi)
            u = k * (z + 0.044715 * z**3)
            t = torch.tanh(u)
            return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
        return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

    def d2(z: Tensor, fz: Tensor) -> Tensor:
        if approximate == "tanh":
            k, c = math.sqrt(2 / math.pi), 0.044715
            t = torch.tanh(k * (z + c * z**3))
            du = k * (1 + 3 * c * z * z)
            sech2 = 1 - t * t
            return sech2 * du + 0.5 * z * (-2 * t * sech2 * du * du + sech2 * k * 6 * c * z)
        return torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) * (2 - z * z)

    return ActivationMath(
        lambda z, out: aten.gelu.out(z, approximate=approximate, out=out),
        lambda g, z, fz, out: aten.gelu_backward.grad_input(g, z, approximate=approximate, grad_input=out),
        lambda z: F.gelu(z, approximate=approximate),
        d1,
        d2,
    )


def _elu(alpha: float) -> ActivationMath:
    return ActivationMath(
        lambda z, out: aten.elu.out(z, alpha, 1.0, 1.0, out=out),
        lambda g, z, fz, out: aten.elu_backward.grad_input(g, alpha, 1.0, 1.0, False, z, grad_input=out),
        lambda z: F.elu(z, alpha),
        lambda z, fz: torch.where(z > 0, torch.ones_like(z), fz + alpha),
        lambda z, fz: torch.where(z > 0, torch.zeros_like(z), fz + alpha),
    )


def _leaky_relu(slope: float) -> ActivationMath:
    return ActivationMath(
        lambda z, out: aten.leaky_relu.out(z, slope, out=out),
        lambda g, z, fz, out: aten.leaky_relu_backward.grad_input(g, z, slope, False, grad_input=out),
        lambda z: F.leaky_relu(z, slope),
        lambda z, fz: torch.where(z > 0, torch.ones_like(z), torch.full_like(z, slope)),
        lambda z, fz: torch.zeros_like(z),
    )


_MATH: dict[ActivationKind, Callable[..., ActivationMath]] = {
    ActivationKind.SILU: _silu,
    ActivationKind.TANH: _tanh,
    ActivationKind.SIGMOID: _sigmoid,
    ActivationKind.RELU: _relu,
    ActivationKind.SOFTPLUS: _softplus,
    ActivationKind.GELU: lambda: _gelu("none"),
    ActivationKind.GELU_TANH: lambda: _gelu("tanh"),
    ActivationKind.ELU: _elu,
    ActivationKind.LEAKY_RELU: _leaky_relu,
}


@functools.lru_cache(maxsize=None)
def math_of(activation: Activation) -> ActivationMath:
    """The arithmetic of ``activation`` (made once per kind and parameters)."""
    return _MATH[activation.kind](*activation.params)


def describe(program: FeedForward) -> str:
    """The words for this path in a run's ``path``."""
    return f"closed-form gradient of a {program.describe()}"


def forward(program: FeedForward, x: Tensor) -> Tensor:
    """``E(x): (n,)`` by the program, differentiable in the weights (and ``x``); ``x: (n, d)``."""
    h = x
    for layer in program.layers:
        h = F.linear(h, layer.linear.weight, layer.linear.bias)
        if layer.activation is not None:
            h = math_of(layer.activation).apply(h)  # the same ATen kernel as the module's
    h = h.squeeze(-1)
    return h if program.sign == 1.0 else h * program.sign


def energy(program: FeedForward, x: Tensor) -> Tensor:
    """``E(x): (n,)`` by the program, with no autograd graph."""
    with torch.no_grad():
        return forward(program, x)


def score_terms(program: FeedForward, x: Tensor, v: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """``(∇ₓE(x): (n, d), vᵀ∇²ₓE(x) v: (n,) or None)`` as differentiable expressions of the parameters (and of
    ``x``): the chain rule forwards for the tangent ``v`` and backwards for the gradient, so a loss of these needs
    one backward pass, not autograd nested in autograd (losses of the gradient)."""
    layers, sign = program.layers, program.sign
    zs, fzs, tangents = [], [], []
    h, t = x, v
    for layer in layers[:-1]:
        act = math_of(layer.activation)
        z = F.linear(h, layer.linear.weight, layer.linear.bias)
        fz = act.apply(z)
        zs.append(z), fzs.append(fz)
        if v is not None:
            tz = F.linear(t, layer.linear.weight)
            tangents.append(tz)
            t = act.d1(z, fz) * tz
        h = fz
    g = layers[-1].linear.weight[0] * sign  # ∂E/∂h of the last hidden layer, (width,)
    g_dot: Optional[Tensor] = None  # its derivative along v
    for i in range(len(layers) - 2, -1, -1):
        act, weight = math_of(layers[i].activation), layers[i].linear.weight
        d1 = act.d1(zs[i], fzs[i])
        e = g * d1
        if v is not None:
            e_dot = g * act.d2(zs[i], fzs[i]) * tangents[i]
            if g_dot is not None:
                e_dot = e_dot + g_dot * d1
            g_dot = e_dot @ weight
        g = e @ weight
    if g.dim() == 1:  # no hidden layer: E is linear
        g = g.expand_as(x)
    if v is None:
        return g, None
    return g, (g_dot * v).sum(-1) if g_dot is not None else x.new_zeros(x.shape[0])


def bind(program: FeedForward, like: Tensor) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """``energy_and_gradient(x) -> (E: (n,), ∇ₓE: (n, d))`` for batches like ``like``; the intermediate
    activations live in buffers reused across calls (the returned tensors are fresh)."""
    buffers: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = {}
    sign = program.sign
    hidden = [(layer.linear, math_of(layer.activation)) for layer in program.hidden]
    out_layer = program.layers[-1].linear

    def workspace(x: Tensor) -> list[Tensor]:
        key = (x.shape[0], x.dtype, x.device)
        ws = buffers.get(key)
        if ws is None:
            buffers.clear()  # one batch size at a time
            ws = []
            for linear, _ in hidden:  # per hidden layer: pre-activation z, activation f(z)
                shape = (x.shape[0], linear.out_features)
                ws += [torch.empty(shape, dtype=x.dtype, device=x.device), torch.empty(shape, dtype=x.dtype, device=x.device)]
            widest = max((linear.out_features for linear, _ in hidden), default=1)
            ws += [torch.empty(x.shape[0] * widest, dtype=x.dtype, device=x.device) for _ in range(2)]
            buffers[key] = ws
        return ws

    def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            ws = workspace(x)
            h = x
            for i, (linear, act) in enumerate(hidden):
                z, a = ws[2 * i], ws[2 * i + 1]
                if linear.bias is None:
                    torch.mm(h, linear.weight.t(), out=z)
                else:
                    torch.addmm(linear.bias, h, linear.weight.t(), out=z)
                act.forward(z, a)
                h = a
            e = F.linear(h, out_layer.weight, out_layer.bias).squeeze(-1)
            if not hidden:
                return e.mul_(sign), (out_layer.weight[0] * sign).expand_as(x).clone()
            n = x.shape[0]
            flat_a, flat_b = ws[-2], ws[-1]
            grad = (out_layer.weight[0] * sign).expand(n, out_layer.weight.shape[1])
            for i in range(len(hidden) - 1, -1, -1):
                (linear, act), z, a = hidden[i], ws[2 * i], ws[2 * i + 1]
                d = flat_a[: z.numel()].view_as(z)
                act.backward(grad, z, a, d)  # d = grad * f'(z)
                if i == 0:
                    return e.mul_(sign), torch.mm(d, linear.weight)
                width = linear.in_features
                grad = torch.mm(d, linear.weight, out=flat_b[: n * width].view(n, width))
                flat_a, flat_b = flat_b, flat_a
        raise AssertionError("unreachable")

    return energy_and_gradient


def check_layers(program: FeedForward) -> None:
    """An :class:`~ebmcore.errors.InputError` naming the first ``Linear`` layer whose weights differ in dtype or device
    from the first layer's: no path can run such a network (torch refuses the product), so say which and the fix."""
    first = program.layers[0].weight
    dtype, device = first.dtype, first.device  # read once: each read of a device makes an object
    for i, layer in enumerate(program.layers):
        for t in (layer.weight, layer.bias):
            if t is not None and (t.dtype != dtype or t.device != device):
                raise InputError(
                    f"Linear layer {i} of the network ({layer.linear}) holds {t.dtype} weights on {t.device} but "
                    f"the first layer holds {first.dtype} on {first.device}; give every layer one dtype and "
                    f"device: model.to({first.dtype}) (or model.to(device))."
                )


def refusal(program: FeedForward, like: Tensor) -> Optional[str]:
    """Why the closed form cannot take inputs like ``like`` (None: it can): not a floating ``(n, d)`` batch, or a first
    layer whose width, dtype or device does not fit them. Layers that disagree among themselves are an error
    (:func:`check_layers`)."""
    if like.dim() != 2 or like.shape[0] == 0 or not like.is_floating_point():
        return "inputs are not a floating (n, d) batch"
    first = program.layers[0].linear
    if first.in_features != like.shape[1]:
        return f"the first layer takes {first.in_features} features, the inputs have {like.shape[1]}"
    check_layers(program)
    weight = program.layers[0].weight
    if weight.dtype != like.dtype or weight.device != like.device:
        return (
            f"the first layer is {str(weight.dtype).removeprefix('torch.')} on {weight.device}, the "
            f"inputs {str(like.dtype).removeprefix('torch.')} on {like.device}"
        )
    return None


def closed_form(program: Program, like: Tensor) -> tuple[Optional[FeedForward], str]:
    """``(program, "")`` when ``program`` is a :class:`FeedForward` program that takes inputs like ``like: (n, d)``;
    otherwise ``(None, why)``."""
    if not isinstance(program, FeedForward):
        return None, program.reason if isinstance(program, Opaque) else f"a {program.describe()} has no closed-form gradient here"
    why = refusal(program, like)
    return (None, why) if why is not None else (program, "")


def why_not(program: Program, like: Tensor) -> str:
    """Why the closed form does not run ``program`` for inputs like ``like`` ("" when it does)."""
    return closed_form(program, like)[1]
