"""What an energy computes, as a typed value: the program that closed forms and native kernels run.

An energy describes itself once (:meth:`ebmcore.EnergyModel.program`) as one of:

- :class:`Analytic`: an analytic energy's kernel op and its arguments (its parameter table);
- :class:`FeedForward`: ``E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x)`` with an :class:`Activation` per
  hidden layer;
- :class:`ConvStack`: 3×3 convolutions with an activation after each, the spatial mean, a linear head;
- :class:`Opaque`: anything else, with the reason; autograd differentiates it.

A program is derived from the model's *structure* (its modules and their settings), never by running or tracing
the user's ``compute_energy``: it is read from the modules each time it is asked for (a network's last program is
returned again while everything it was read from is unchanged: :func:`feedforward_of`), and compares equal to
another exactly when it names the same modules with the same activations and settings, so a cached run keyed on it
is invalidated by any change of structure. Layers hold the model's own modules: an optimizer step, which
changes their weights in place, leaves the program valid.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from torch import Tensor, nn

__all__ = [
    "ActivationKind",
    "Activation",
    "Layer",
    "FeedForward",
    "ConvStack",
    "Analytic",
    "Opaque",
    "Program",
    "activation_of",
    "feedforward_of",
    "parameter_of",
    "sequential_refusal",
]


class ActivationKind(enum.Enum):
    """The pointwise activations ebm differentiates in closed form. Parameters, where a kind has them, are in
    :attr:`Activation.params`, in the order :attr:`param_names` gives."""

    SILU = "silu"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    SOFTPLUS = "softplus"  # (beta, threshold)
    GELU = "gelu"  # exact (erf)
    GELU_TANH = "gelu_tanh"  # the tanh approximation
    ELU = "elu"  # (alpha,)
    LEAKY_RELU = "leaky_relu"  # (negative_slope,)

    @property
    def param_names(self) -> tuple[str, ...]:
        return _PARAM_NAMES.get(self, ())


_PARAM_NAMES = {
    ActivationKind.SOFTPLUS: ("beta", "threshold"),
    ActivationKind.ELU: ("alpha",),
    ActivationKind.LEAKY_RELU: ("negative_slope",),
}


@dataclass(frozen=True)
class Activation:
    """An activation: its :class:`ActivationKind` and its parameters (floats, as :attr:`ActivationKind.param_names`)."""

    kind: ActivationKind
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.params) != len(self.kind.param_names):
            raise ValueError(f"activation {self.kind.value} takes parameters {self.kind.param_names}, got {self.params}")

    def __str__(self) -> str:
        if not self.params:
            return self.kind.value
        return f"{self.kind.value}({', '.join(f'{n}={v:g}' for n, v in zip(self.kind.param_names, self.params))})"


def activation_of(module: nn.Module) -> Optional[Activation]:
    """The activation an ``nn`` module computes, or None (exact types only: a subclass may compute something else)."""
    t = type(module)
    if t is nn.SiLU:
        return Activation(ActivationKind.SILU)
    if t is nn.Tanh:
        return Activation(ActivationKind.TANH)
    if t is nn.Sigmoid:
        return Activation(ActivationKind.SIGMOID)
    if t is nn.ReLU:
        return Activation(ActivationKind.RELU)
    if t is nn.Softplus:
        return Activation(ActivationKind.SOFTPLUS, (float(module.beta), float(module.threshold)))
    if t is nn.GELU:
        return Activation(ActivationKind.GELU_TANH if module.approximate == "tanh" else ActivationKind.GELU)
    if t is nn.ELU:
        return Activation(ActivationKind.ELU, (float(module.alpha),))
    if t is nn.LeakyReLU:
        return Activation(ActivationKind.LEAKY_RELU, (float(module.negative_slope),))
    return None


def parameter_of(module: nn.Module, name: str) -> Any:
    """``getattr(module, name)`` for a module of an exact torch type (``nn.Linear``: no descriptor of that name on its
    class), read from its dictionaries as ``nn.Module.__getattr__`` would, without that Python call: the kernels read
    each layer's weight and bias on every loss call, so a replaced parameter is always the one read."""
    d = module.__dict__
    if name in d:
        return d[name]
    params = d["_parameters"]
    if name in params:
        return params[name]
    return getattr(module, name)  # a buffer, or the AttributeError


@dataclass(frozen=True)
class Layer:
    """One ``nn.Linear`` (the model's own module) and the activation after it (None for the output layer)."""

    linear: nn.Linear
    activation: Optional[Activation]

    @property
    def weight(self) -> Tensor:
        """``linear.weight``, read now (:func:`parameter_of`)."""
        return parameter_of(self.linear, "weight")

    @property
    def bias(self) -> Optional[Tensor]:
        """``linear.bias``, read now (None where the layer has none)."""
        return parameter_of(self.linear, "bias")


@dataclass(frozen=True)
class FeedForward:
    """``E(x) = sign · (Linear_L ∘ f_{L-1} ∘ … ∘ f_1 ∘ Linear_1)(x)`` for ``x: (n, d)``; the last layer is
    ``Linear(·, 1)``. ``sign``: +1 or −1. The closed forms are in :mod:`ebmcore.energies.feedforward`."""

    layers: tuple[Layer, ...]
    sign: float = 1.0

    @property
    def hidden(self) -> tuple[Layer, ...]:
        return self.layers[:-1]

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.layers[0].linear.in_features, *(layer.linear.out_features for layer in self.layers))

    def describe(self) -> str:
        acts = sorted({str(layer.activation) for layer in self.hidden})
        return f"feed-forward network {'-'.join(map(str, self.widths))} ({', '.join(acts) or 'linear'})"


@dataclass(frozen=True)
class ConvStack:
    """``E(x) = head(mean_{h,w}(f(conv_L(… f(conv_1(x))))))`` for images ``x: (n, C, H, W)``: 3×3 convolutions
    (padding 1, square ``strides[l]``; ``convs[l]`` the model's own ``nn.Conv2d``), ``activation`` after each,
    the spatial mean and the linear ``head`` to one output."""

    convs: tuple[nn.Conv2d, ...]
    strides: tuple[int, ...]
    activation: Activation
    head: nn.Linear

    @property
    def weights(self) -> tuple[Tensor, ...]:
        return tuple(c.weight for c in self.convs)

    @property
    def biases(self) -> tuple[Optional[Tensor], ...]:
        return tuple(c.bias for c in self.convs)

    def describe(self) -> str:
        channels = [self.convs[0].in_channels, *(c.out_channels for c in self.convs)]
        return f"conv stack {'-'.join(map(str, channels))}-1 ({self.activation})"


@dataclass(frozen=True)
class Analytic:
    """An analytic energy: its kernel ``op`` name (ops ``<op>_energy``, ``<op>_gradient``, ``<op>_langevin_chain``,
    ...) and the arguments its kernels take after ``x`` (``AnalyticEnergy.kernel_args()``)."""

    op: str
    args: tuple[Any, ...] = field(compare=False)

    def describe(self) -> str:
        return f"analytic energy {self.op}"


@dataclass(frozen=True)
class Opaque:
    """An energy ebm does not read: autograd differentiates ``compute_energy``; ``reason`` says why."""

    reason: str

    def describe(self) -> str:
        return f"opaque ({self.reason})"


Program = Union[Analytic, FeedForward, ConvStack, Opaque]


def _module_refusal(m: nn.Module) -> Optional[str]:
    if m._forward_hooks or m._forward_pre_hooks:
        return f"module {type(m).__name__} has forward hooks"
    if m._backward_hooks or getattr(m, "_backward_pre_hooks", None):  # they change the gradient autograd computes
        return f"module {type(m).__name__} has backward hooks"
    if "parametrizations" in m._modules:  # nn.utils.parametrize.is_parametrized, without its attribute lookup
        return f"module {type(m).__name__} is parametrized (spectral_norm, weight_norm, ...): its weight is computed"
    return None


def _global_hooks() -> Optional[str]:
    torch_module = nn.modules.module
    if getattr(torch_module, "_global_forward_hooks", None) or getattr(torch_module, "_global_forward_pre_hooks", None):
        return "global forward hooks are registered (torch.nn.modules.module.register_module_forward_hook)"
    if getattr(torch_module, "_global_backward_hooks", None) or getattr(torch_module, "_global_backward_pre_hooks", None):
        return "global backward hooks are registered (torch.nn.modules.module.register_module_full_backward_hook)"
    return None


def sequential_refusal(net: nn.Module) -> Optional[str]:
    """Why ``net`` and its submodules cannot be read as a program (None: they can): forward or backward hooks
    (``weight_norm`` and the like), parametrizations, global forward or backward hooks. Asked each time the program
    is (every bind), so a hook registered after construction counts."""
    return _global_hooks() or next((r for m in net.modules() if (r := _module_refusal(m)) is not None), None)


_SETTINGS = {
    nn.Linear: ("in_features", "out_features"),
    nn.Softplus: ("beta", "threshold"),
    nn.GELU: ("approximate",),
    nn.ELU: ("alpha",),
    nn.LeakyReLU: ("negative_slope",),
}
"""The attributes of a module that :func:`feedforward_of` (or the closed form's check of the inputs) reads, by type."""


def _structure(net: nn.Sequential, sign: float) -> list:
    """Everything :func:`feedforward_of` reads of ``net``: the global hooks, ``net``'s own hooks, and per layer in order
    the module itself, its type, its hooks and the settings :data:`_SETTINGS` names. Equal keys give equal programs;
    the weights are not in it (a program holds the modules, whose weights it reads when it runs). Made on every call
    (a flat list: no tuple or function call per layer)."""
    g = nn.modules.module
    key: list = [
        sign,
        bool(
            getattr(g, "_global_forward_hooks", None)
            or getattr(g, "_global_forward_pre_hooks", None)
            or getattr(g, "_global_backward_hooks", None)
            or getattr(g, "_global_backward_pre_hooks", None)
        ),
    ]
    for i, m in enumerate((net, *net._modules.values())):
        if m is None:
            key.append(None)
            continue
        t = type(m)
        key += (
            i and m,  # the layers themselves; not the network (the cache holds its key: the network must stay collectable)
            t,
            bool(
                m._forward_hooks
                or m._forward_pre_hooks
                or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None)
                or "parametrizations" in m._modules
            ),
        )
        settings = _SETTINGS.get(t)
        if settings is not None:
            key += [getattr(m, a) for a in settings]
    return key


_PROGRAMS: "weakref.WeakKeyDictionary[nn.Module, tuple[list, Union[FeedForward, Opaque]]]" = weakref.WeakKeyDictionary()
""":func:`feedforward_of`'s last program of each network with the :func:`_structure` it was read from."""


def feedforward_of(net: nn.Module, sign: float = 1.0) -> Union[FeedForward, Opaque]:
    """The :class:`FeedForward` program of an ``nn.Sequential`` of ``Linear`` layers and activations (and
    ``Identity``) ending in ``Linear(·, 1)``, read from its modules; else :class:`Opaque` naming the module.

    Asked on every loss call, so the program read last is kept with the network's :func:`_structure` and returned
    again while that is unchanged: a layer replaced, added or removed, a hook (forward or backward, of a module or
    global) registered or removed, a parametrization, or a changed activation setting reads the modules anew."""
    if type(net) is not nn.Sequential:
        return Opaque(f"the network is a {type(net).__name__}, not an nn.Sequential of Linear layers and activations")
    key = _structure(net, float(sign))
    cached = _PROGRAMS.get(net)
    if cached is not None and cached[0] == key:
        return cached[1]
    program = _read_feedforward(net, float(sign))
    _PROGRAMS[net] = (key, program)
    return program


def _read_feedforward(net: nn.Sequential, sign: float) -> Union[FeedForward, Opaque]:
    """:func:`feedforward_of`, read from the modules."""
    refusal = _global_hooks() or _module_refusal(net)
    if refusal is not None:
        return Opaque(refusal)
    layers: list[Layer] = []
    linear: Optional[nn.Linear] = None
    for i, module in enumerate(net._modules.values()):
        refusal = _module_refusal(module)  # the layers read below have no submodules of their own
        if refusal is not None:
            return Opaque(refusal)
        if type(module) is nn.Linear:
            if linear is not None:
                return Opaque(f"layer {i}: two Linear layers without an activation between them")
            linear = module
        elif type(module) is nn.Identity:
            continue
        else:
            act = activation_of(module)
            if act is None:
                return Opaque(f"layer {i}: module {type(module).__name__} has no closed-form derivative here")
            if linear is None:
                return Opaque(f"layer {i}: an activation that does not follow a Linear layer")
            layers.append(Layer(linear, act))
            linear = None
    if linear is None or linear.out_features != 1:
        return Opaque("the network does not end in Linear(·, 1)")
    layers.append(Layer(linear, None))
    return FeedForward(tuple(layers), float(sign))
