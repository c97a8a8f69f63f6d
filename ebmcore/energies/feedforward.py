"""The input gradient of a feed-forward energy without autograd: ``Linear`` and pointwise activation layers.

An energy whose ``compute_energy`` is a chain ``Linear → activation → … → Linear(·, 1)`` (then ``squeeze(-1)``,
optionally negated) has ``∇ₓE`` in closed form: the forward pass, then the chain rule backwards with the same
ATen kernels autograd would call (``addmm``/``mm`` and ``silu_backward``, ``tanh_backward``, …). Done here on
buffers reused from step to step, with no graph and no autograd engine, the result equals autograd's to the last
bit and costs less (see the performance guide, W4). :func:`plan` recognises the chain by tracing
``compute_energy`` with ``torch.fx`` once per model structure, and checks on a few rows that the plan gives the
model's energy, again whenever the model's attributes or tensors change; anything else keeps autograd.
"""

from __future__ import annotations

import math
import operator
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ebmcore.errors import InputError

__all__ = ["FeedForward", "plan", "why_not"]

aten = torch.ops.aten

# An activation, twice: as the ATen ops autograd records for it, run into buffers with no graph (``forward``,
# ``backward``: so the sampler's gradient is autograd's exactly), and as differentiable expressions of ``z`` and
# ``f(z)`` for its first and second derivatives (``d1``, ``d2``: for losses that differentiate the gradient).
Forward = Callable[[Tensor, Tensor], Any]
Backward = Callable[[Tensor, Tensor, Tensor, Tensor], Any]
Derivative = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Activation:
    name: str
    forward: Forward  # (z, out) -> out = f(z), no graph
    backward: Backward  # (grad, z, fz, out) -> out = grad * f'(z), no graph
    apply: Callable[[Tensor], Tensor]  # f(z), differentiable
    d1: Derivative  # (z, fz) -> f'(z), differentiable
    d2: Derivative  # (z, fz) -> f''(z), differentiable


def _silu() -> Activation:
    def d1(z: Tensor, fz: Tensor) -> Tensor:  # s + f(z)(1 − s), with f(z) = z·s
        s = torch.sigmoid(z)
        return s + fz * (1 - s)

    def d2(z: Tensor, fz: Tensor) -> Tensor:  # s(1 − s)(2 + z − 2f(z))
        s = torch.sigmoid(z)
        return (s - s * s) * (2 + z - 2 * fz)

    return Activation("silu", lambda z, out: aten.silu.out(z, out=out),
                      lambda g, z, fz, out: aten.silu_backward.grad_input(g, z, grad_input=out), F.silu, d1, d2)


def _tanh() -> Activation:
    return Activation("tanh", lambda z, out: torch.tanh(z, out=out),
                      lambda g, z, fz, out: aten.tanh_backward.grad_input(g, fz, grad_input=out), torch.tanh,
                      lambda z, t: 1 - t * t, lambda z, t: -2 * t * (1 - t * t))


def _sigmoid() -> Activation:
    return Activation("sigmoid", lambda z, out: torch.sigmoid(z, out=out),
                      lambda g, z, fz, out: aten.sigmoid_backward.grad_input(g, fz, grad_input=out), torch.sigmoid,
                      lambda z, s: s * (1 - s), lambda z, s: s * (1 - s) * (1 - 2 * s))


def _relu() -> Activation:
    return Activation("relu", lambda z, out: torch.clamp_min(z, 0, out=out),
                      lambda g, z, fz, out: out.copy_(aten.threshold_backward(g, z, 0)), torch.relu,
                      lambda z, fz: (z > 0).to(z.dtype), lambda z, fz: torch.zeros_like(z))


def _softplus(beta: float, threshold: float) -> Activation:
    def d1(z: Tensor, fz: Tensor) -> Tensor:  # linear above the threshold, as torch computes it
        return torch.where(z * beta > threshold, torch.ones_like(z), torch.sigmoid(z * beta))

    def d2(z: Tensor, fz: Tensor) -> Tensor:
        s = torch.sigmoid(z * beta)
        return torch.where(z * beta > threshold, torch.zeros_like(z), beta * s * (1 - s))

    return Activation(f"softplus(beta={beta}, threshold={threshold})",
                      lambda z, out: aten.softplus.out(z, beta, threshold, out=out),
                      lambda g, z, fz, out: aten.softplus_backward.grad_input(g, z, beta, threshold, grad_input=out),
                      lambda z: F.softplus(z, beta, threshold), d1, d2)


def _gelu(approximate: str) -> Activation:
    def d1(z: Tensor, fz: Tensor) -> Tensor:
        if approximate == "tanh":
            k = math.sqrt(2 / math.pi)
            u = k * (z + 0.044715 * z ** 3)
            t = torch.tanh(u)
            return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
        return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

    def d2(z: Tensor, fz: Tensor) -> Tensor:
        if approximate == "tanh":
            k, c = math.sqrt(2 / math.pi), 0.044715
            t = torch.tanh(k * (z + c * z ** 3))
            du = k * (1 + 3 * c * z * z)
            sech2 = 1 - t * t
            return sech2 * du + 0.5 * z * (-2 * t * sech2 * du * du + sech2 * k * 6 * c * z)
        return torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) * (2 - z * z)

    return Activation(f"gelu({approximate})", lambda z, out: aten.gelu.out(z, approximate=approximate, out=out),
                      lambda g, z, fz, out: aten.gelu_backward.grad_input(g, z, approximate=approximate,
                                                                          grad_input=out),
                      lambda z: F.gelu(z, approximate=approximate), d1, d2)


def _elu(alpha: float) -> Activation:
    return Activation(f"elu(alpha={alpha})", lambda z, out: aten.elu.out(z, alpha, 1.0, 1.0, out=out),
                      lambda g, z, fz, out: aten.elu_backward.grad_input(g, alpha, 1.0, 1.0, False, z,
                                                                         grad_input=out),
                      lambda z: F.elu(z, alpha),
                      lambda z, fz: torch.where(z > 0, torch.ones_like(z), fz + alpha),
                      lambda z, fz: torch.where(z > 0, torch.zeros_like(z), fz + alpha))


def _leaky_relu(slope: float) -> Activation:
    return Activation(f"leaky_relu({slope})", lambda z, out: aten.leaky_relu.out(z, slope, out=out),
                      lambda g, z, fz, out: aten.leaky_relu_backward.grad_input(g, z, slope, False, grad_input=out),
                      lambda z: F.leaky_relu(z, slope),
                      lambda z, fz: torch.where(z > 0, torch.ones_like(z), torch.full_like(z, slope)),
                      lambda z, fz: torch.zeros_like(z))


def _module_activation(m: nn.Module) -> Optional[Activation]:
    """The activation an ``nn`` module computes, if it is one we differentiate in closed form (exact type only:
    a subclass may compute something else)."""
    t = type(m)
    if t is nn.SiLU:
        return _silu()
    if t is nn.Tanh:
        return _tanh()
    if t is nn.Sigmoid:
        return _sigmoid()
    if t is nn.ReLU:
        return _relu()
    if t is nn.Softplus:
        return _softplus(float(m.beta), float(m.threshold))
    if t is nn.GELU:
        return _gelu(m.approximate)
    if t is nn.ELU:
        return _elu(float(m.alpha))
    if t is nn.LeakyReLU:
        return _leaky_relu(float(m.negative_slope))
    return None


_FUNCTION_ACTIVATIONS: dict[Any, Callable[[], Activation]] = {
    F.silu: _silu, torch.tanh: _tanh, F.tanh: _tanh, torch.sigmoid: _sigmoid, F.sigmoid: _sigmoid,
    torch.relu: _relu, F.relu: _relu, F.softplus: lambda: _softplus(1.0, 20.0), F.gelu: lambda: _gelu("none"),
    F.elu: lambda: _elu(1.0),
}
_METHOD_ACTIVATIONS: dict[str, Callable[[], Activation]] = {"tanh": _tanh, "sigmoid": _sigmoid, "relu": _relu}


@dataclass(frozen=True)
class Layer:
    linear: nn.Linear
    activation: Optional[Activation]  # None for the output layer


class FeedForward:
    """``E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x)`` for ``x: (n, d)``, with its gradient in closed form.

    ``sign`` is +1 or -1 (an energy written as ``-net(x).squeeze(-1)``). The layers are the model's own modules,
    so a training step that changes their weights changes the plan's results too.
    """

    def __init__(self, layers: list[Layer], sign: float) -> None:
        self.layers, self.sign = layers, sign
        self._description: Optional[str] = None

    def describe(self) -> str:
        """The words for this path (widths and activations), made once: a sampler binds the energy at every run."""
        if self._description is None:
            widths = [self.layers[0].linear.in_features] + [layer.linear.out_features for layer in self.layers]
            acts = sorted({layer.activation.name for layer in self.layers if layer.activation is not None})
            self._description = (f"closed-form gradient of a feed-forward network {'-'.join(map(str, widths))} "
                                 f"({', '.join(acts) or 'linear'})")
        return self._description

    def energy(self, x: Tensor) -> Tensor:
        """``E(x): (n,)`` by the plan (no autograd graph)."""
        with torch.no_grad():
            h = x
            for layer in self.layers:
                h = F.linear(h, layer.linear.weight, layer.linear.bias)
                if layer.activation is not None:
                    h = layer.activation.apply(h)  # the same ATen kernel as the module's
            h = h.squeeze(-1)
            return h if self.sign == 1.0 else h * self.sign

    def score_terms(self, x: Tensor, v: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """``(∇ₓE(x): (n, d), vᵀ∇²ₓE(x) v: (n,) or None)`` as differentiable expressions of the parameters (and
        of ``x``): the chain rule forwards for the tangent ``v`` and backwards for the gradient, so a loss of
        these needs one backward pass, not autograd nested in autograd (score matching)."""
        zs, fzs, tangents = [], [], []
        h, t = x, v
        for layer in self.layers[:-1]:
            z = F.linear(h, layer.linear.weight, layer.linear.bias)
            fz = layer.activation.apply(z)
            zs.append(z), fzs.append(fz)
            if v is not None:
                tz = F.linear(t, layer.linear.weight)
                tangents.append(tz)
                t = layer.activation.d1(z, fz) * tz
            h = fz
        g = self.layers[-1].linear.weight[0] * self.sign  # ∂E/∂h of the last hidden layer, (width,)
        g_dot: Optional[Tensor] = None  # its derivative along v
        for i in range(len(self.layers) - 2, -1, -1):
            act, weight = self.layers[i].activation, self.layers[i].linear.weight
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

    def bind(self, like: Tensor) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
        """``energy_and_gradient(x) -> (E: (n,), ∇ₓE: (n, d))`` for batches like ``like``; the intermediate
        activations live in buffers reused across calls (the returned tensors are fresh)."""
        buffers: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = {}
        layers, sign = self.layers, self.sign
        hidden = layers[:-1]
        out_layer = layers[-1].linear

        def workspace(x: Tensor) -> list[Tensor]:
            key = (x.shape[0], x.dtype, x.device)
            ws = buffers.get(key)
            if ws is None:
                buffers.clear()  # one batch size at a time
                ws = []
                for layer in hidden:  # per hidden layer: pre-activation z, activation f(z)
                    shape = (x.shape[0], layer.linear.out_features)
                    ws += [torch.empty(shape, dtype=x.dtype, device=x.device),
                           torch.empty(shape, dtype=x.dtype, device=x.device)]
                widest = max((layer.linear.out_features for layer in hidden), default=1)
                ws += [torch.empty(x.shape[0] * widest, dtype=x.dtype, device=x.device) for _ in range(2)]
                buffers[key] = ws
            return ws

        def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
            with torch.no_grad():
                ws = workspace(x)
                h = x
                for i, layer in enumerate(hidden):
                    z, a = ws[2 * i], ws[2 * i + 1]
                    if layer.linear.bias is None:
                        torch.mm(h, layer.linear.weight.t(), out=z)
                    else:
                        torch.addmm(layer.linear.bias, h, layer.linear.weight.t(), out=z)
                    layer.activation.forward(z, a)
                    h = a
                energy = F.linear(h, out_layer.weight, out_layer.bias).squeeze(-1)
                if not hidden:
                    return energy.mul_(sign), (out_layer.weight[0] * sign).expand_as(x).clone()
                n = x.shape[0]
                flat_a, flat_b = ws[-2], ws[-1]
                grad = (out_layer.weight[0] * sign).expand(n, out_layer.weight.shape[1])
                for i in range(len(hidden) - 1, -1, -1):
                    layer, z, a = hidden[i], ws[2 * i], ws[2 * i + 1]
                    d = flat_a[: z.numel()].view_as(z)
                    layer.activation.backward(grad, z, a, d)  # d = grad * f'(z)
                    if i == 0:
                        return energy.mul_(sign), torch.mm(d, layer.linear.weight)
                    width = layer.linear.in_features
                    grad = torch.mm(d, layer.linear.weight, out=flat_b[: n * width].view(n, width))
                    flat_a, flat_b = flat_b, flat_a
            raise AssertionError("unreachable")

        return energy_and_gradient


# -- recognising a feed-forward energy ---------------------------------------------------------


class _Root(nn.Module):
    def __init__(self, energy: nn.Module) -> None:
        super().__init__()
        self.energy = energy

    def forward(self, x: Tensor) -> Tensor:
        return self.energy.compute_energy(x)


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")  # torch.nn.modules.module's registries


def _trace(energy: nn.Module) -> tuple[Optional[FeedForward], str]:
    if any(getattr(nn.modules.module, name, None) for name in _GLOBAL_HOOKS):
        return None, "global forward hooks are registered (torch.nn.modules.module.register_module_forward_hook)"
    root = _Root(energy)
    try:
        graph = torch.fx.symbolic_trace(root).graph
    except Exception as exc:  # anything torch.fx cannot trace keeps autograd
        return None, f"compute_energy cannot be traced by torch.fx ({type(exc).__name__})"
    nodes = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    layers: list[Layer] = []
    linear: Optional[nn.Linear] = None
    prev, sign, reduced = placeholder, 1.0, False
    for node in nodes:
        if len(node.all_input_nodes) != 1 or node.all_input_nodes[0] is not prev:
            return None, f"compute_energy combines several values at {_name(node)}, not one chain of layers"
        act: Optional[Activation] = None
        if node.op == "call_module":
            module = root.get_submodule(node.target)
            if module._forward_pre_hooks or module._forward_hooks:  # weight_norm and the like recompute the weight
                return None, f"module {type(module).__name__} has forward hooks (weight_norm, spectral_norm, ...)"
            if type(module) is nn.Linear:
                if linear is not None or reduced:
                    return None, "two Linear layers without an activation between them"
                linear = module
            elif type(module) is nn.Identity:
                pass
            else:
                act = _module_activation(module)
                if act is None:
                    return None, f"module {type(module).__name__} has no closed-form derivative here"
        elif node.op == "call_function" and node.target in _FUNCTION_ACTIVATIONS and len(node.args) == 1 and not node.kwargs:
            act = _FUNCTION_ACTIVATIONS[node.target]()
        elif node.op == "call_method" and node.target in _METHOD_ACTIVATIONS and len(node.args) == 1 and not node.kwargs:
            act = _METHOD_ACTIVATIONS[node.target]()
        elif _is_squeeze(node) and linear is not None and linear.out_features == 1 and not reduced:
            reduced = True
        elif node.op in ("call_function", "call_method") and node.target in (operator.neg, torch.neg, "neg") and \
                len(node.args) == 1 and not node.kwargs:
            sign = -sign
        else:
            return None, f"compute_energy applies {_name(node)}, not a Linear layer or an activation with a closed form here"
        if act is not None:
            if linear is None or reduced:
                return None, "an activation that does not follow a Linear layer"
            layers.append(Layer(linear, act))
            linear = None
        prev = node
    if linear is None or not reduced:
        return None, "compute_energy does not end in Linear(·, 1) then squeeze(-1)"
    layers.append(Layer(linear, None))
    return FeedForward(layers, sign), ""


def _name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(node.target)).__name__ if node.graph.owning_module \
            else str(node.target)
    if node.op == "call_method":
        return f".{node.target}()"
    return getattr(node.target, "__name__", str(node.target))


def _is_squeeze(node: torch.fx.Node) -> bool:
    if node.op != "call_method" or node.kwargs and set(node.kwargs) != {"dim"}:
        return False
    args = list(node.args[1:]) + list(node.kwargs.values())
    if node.target == "squeeze":
        return args in ([-1], [1])
    if node.target in ("view", "reshape"):
        return args == [-1]
    if node.target == "flatten":
        return args == []
    return False


# model -> [fingerprint, plan or None, why, state key at the last successful probe, the objects it names]:
# a cache only (weak keys; pickling or copying a model never sees it)
_TRACED: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()


def _fingerprint(energy: nn.Module, modules: list[nn.Module]) -> tuple:
    """The model's structure, which the trace depends on: its modules and their types (a parametrization
    changes the type), their forward hooks and the global ones (``weight_norm`` is a hook)."""
    hooks = tuple(tuple(getattr(nn.modules.module, name, ())) for name in _GLOBAL_HOOKS)
    return (type(energy), tuple((id(m), type(m), tuple(m._forward_hooks), tuple(m._forward_pre_hooks)) for m in modules),
            hooks)


def _state(modules: list[nn.Module]) -> tuple[tuple, tuple]:
    """``(key, held)``: what a probe's verdict depends on besides the structure, as a key that compares cheaply,
    and the objects it names. The key is the identity of every attribute of every module (its training mode, a
    flag ``compute_energy`` branches on, a config object) and of every parameter and buffer, and where each
    tensor's data lives; ``held`` keeps those objects (and the submodules, which the structure names by identity;
    not the model itself, the cache's weak key) alive while the key is cached, so no new object can take an old
    one's identity. Not the tensors' values: the plan reads the layers' weights when it runs, so an
    optimizer step leaves the verdict standing. A container changed in place (a list, a dict) is not seen."""
    attributes: list[Any] = []
    tensors: list[Tensor] = []
    for m in modules:
        attributes.extend(m.__dict__.values())
        tensors.extend(m._parameters.values())
        tensors.extend(m._buffers.values())
    tensors = [t for t in tensors if t is not None]
    key = (tuple(map(id, attributes)), tuple(map(id, tensors)), tuple([t.data_ptr() for t in tensors]))
    return key, (tuple(modules[1:]), tuple(attributes), tuple(tensors))


def plan(energy: nn.Module, like: Tensor) -> tuple[Optional[FeedForward], str]:
    """``(plan, "")`` when ``energy.compute_energy`` is a feed-forward chain and the plan reproduces its energy
    at a few rows of ``like: (n, d)``; otherwise ``(None, why)``. Traces once per model structure (its modules,
    their types and hooks; cached on the model), and probes again only when the model's attributes or
    parameter and buffer tensors have changed since its last successful probe (:func:`_state`): not at every
    training step, since the plan reads the weights when it runs."""
    if like.dim() != 2 or like.shape[0] == 0 or not like.is_floating_point():
        return None, "inputs are not a floating (n, d) batch"
    cached = _TRACED.get(energy)
    modules = list(energy.modules())
    fingerprint = _fingerprint(energy, modules)
    if cached is None or cached[0] != fingerprint:
        cached = [fingerprint, *_trace(energy), None, None]
        _TRACED[energy] = cached
    ff, why = cached[1], cached[2]
    if ff is None:
        return None, why
    first = ff.layers[0].linear
    weight = first.weight
    if first.in_features != like.shape[1] or weight.dtype != like.dtype or weight.device != like.device:
        return None, "the first layer does not take these inputs (shape, dtype or device)"
    _check_layers_agree(energy, ff)
    key, held = _state(modules)
    if cached[3] != key:
        cached[3:] = [None, None]
        probe = like[:4].detach()
        with torch.no_grad():
            if not torch.equal(ff.energy(probe), energy.compute_energy(probe)):
                return None, "the traced plan does not reproduce compute_energy (it depends on more than its layers)"
        cached[3:] = [key, held]
    return ff, ""


def _check_layers_agree(energy: nn.Module, ff: FeedForward) -> None:
    """An :class:`InputError` naming the first ``Linear`` whose weights differ in dtype or device from the first
    layer's (torch's own error, from inside the plan, would name neither the layer nor the fix)."""
    first = ff.layers[0].linear.weight
    for layer in ff.layers[1:]:
        weight = layer.linear.weight
        if weight.dtype != first.dtype or weight.device != first.device:
            name = next((n for n, m in energy.named_modules() if m is layer.linear), "?")
            fix = f"model.to({first.dtype})" if weight.dtype != first.dtype else f"model.to('{first.device}')"
            raise InputError(f"{type(energy).__name__}: layer {name!r} ({layer.linear}) holds {weight.dtype} weights on "
                             f"{weight.device} but the first layer holds {first.dtype} on {first.device}; put the whole "
                             f"model in one dtype and on one device: {fix}.")


def why_not(energy: nn.Module, like: Tensor) -> str:
    """Why ``energy`` keeps autograd for inputs like ``like`` ("" when the closed form applies)."""
    return plan(energy, like)[1]
