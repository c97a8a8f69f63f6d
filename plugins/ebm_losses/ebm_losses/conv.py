"""A small convolutional energy ``E_θ(x)`` for images ``x: (n, C, H, W)``, registered as ``conv``."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ebmcore import EnergyModel
from ebmcore.energies.mlp import ACTIVATIONS
from ebmcore.energies.program import ConvStack, Opaque, Program, activation_of, sequential_refusal
from ebmcore.errors import InputError
from ebmcore.validation import check_placement, check_seed

__all__ = ["ConvEnergy"]


def _positive_ints(value: Any, name: str) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise InputError(f"ConvEnergy: {name} must be positive integers, got {value!r}.")
    return values


class ConvEnergy(EnergyModel):
    """``len(widths)`` 3×3 convolutions (stride 1, then 2 from the second on) with ``activation`` after each,
    global average pooling over space, and a linear map to the scalar ``E(x): (n,)``.

    ``image_shape`` is ``(C, H, W)`` (``event_shape``). ``spectral_norm`` wraps every convolution and the last
    linear map in :func:`torch.nn.utils.parametrizations.spectral_norm` (one power iteration per forward pass in
    training mode), which bounds the network's Lipschitz constant and keeps short-run Langevin stable. Use a
    smooth activation (``silu``, the default, or ``softplus``, ``elu``, ``tanh``): Langevin follows ``∇ₓE``.
    ``seed`` initialises every weight from a local generator with PyTorch's default scale ``U(±1/√fan_in)``
    (the global RNG is left untouched); without it PyTorch's default initialisation draws from the global RNG.
    """

    def __init__(
        self,
        image_shape: Sequence[int] = (1, 8, 8),
        widths: Sequence[int] = (32, 64, 64),
        activation: str = "silu",
        *,
        spectral_norm: bool = False,
        seed: int | None = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        shape = _positive_ints(image_shape, "image_shape")
        if len(shape) != 3:
            raise InputError(f"ConvEnergy: image_shape must be (C, H, W), got {image_shape!r}; a grey 8×8 image is (1, 8, 8).")
        widths = _positive_ints(widths, "widths")
        seed = check_seed(seed, "ConvEnergy: seed")
        dtype, device = check_placement(dtype, device, "ConvEnergy")
        if activation not in ACTIVATIONS:
            raise InputError(f"ConvEnergy: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
        self.event_shape = tuple(shape)
        self.activation = activation
        self.spectral_norm = bool(spectral_norm)
        build_on = "meta" if seed is not None else device
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip([shape[0], *widths], widths)):
            layers += [
                nn.Conv2d(c_in, c_out, 3, stride=1 if i == 0 else 2, padding=1, dtype=dtype, device=build_on),
                ACTIVATIONS[activation](),
            ]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], 1, dtype=dtype, device=build_on)
        if seed is not None:
            self.to_empty(device=device if device is not None else "cpu")
            generator = torch.Generator(device="cpu").manual_seed(seed)
            with torch.no_grad():
                for layer in [*self.features, self.head]:
                    if isinstance(layer, (nn.Conv2d, nn.Linear)):
                        bound = (layer.weight[0].numel()) ** -0.5
                        for p in (layer.weight, layer.bias):
                            p.copy_((torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound)
        if self.spectral_norm:
            # the power iteration's initial vectors come from the RNG: a fork keeps the global stream untouched
            with torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                for i, layer in enumerate(self.features):
                    if isinstance(layer, nn.Conv2d):
                        self.features[i] = nn.utils.parametrizations.spectral_norm(layer)
                self.head = nn.utils.parametrizations.spectral_norm(self.head)

    def compute_energy(self, x: Tensor) -> Tensor:
        """``x: (n, C, H, W)`` -> ``(n,)``."""
        return self.head(self.features(x).mean((-2, -1))).squeeze(-1)

    def program(self) -> Program:
        """The layers as a :class:`~ebmcore.energies.program.ConvStack`, read from the modules, or
        :class:`~ebmcore.energies.program.Opaque` with why a kernel must not run them itself: ``spectral_norm`` or
        another parametrization (the weights are computed on every forward pass), hooks on a module, an overridden
        :meth:`compute_energy`, a layer changed after construction."""
        if self.spectral_norm:
            return Opaque("spectral_norm re-normalises the weights on every forward pass")
        if type(self).compute_energy is not ConvEnergy.compute_energy:
            return Opaque(f"{type(self).__name__} overrides compute_energy, which ebm does not read")
        refusal = sequential_refusal(self)
        if refusal is not None:
            return Opaque(refusal)
        convs = list(self.features)[0::2]
        acts = [activation_of(m) for m in list(self.features)[1::2]]
        if (
            len(convs) != len(acts)
            or type(self.head) is not nn.Linear
            or any(
                type(m) is not nn.Conv2d
                or m.kernel_size != (3, 3)
                or m.padding != (1, 1)
                or m.dilation != (1, 1)
                or m.groups != 1
                or m.stride[0] != m.stride[1]
                for m in convs
            )
        ):
            return Opaque("a layer was changed from 3×3 convolutions (padding 1, square stride) and a Linear head")
        if acts[0] is None or any(a != acts[0] for a in acts):
            return Opaque("the activations are not one activation with a closed-form derivative after every convolution")
        return ConvStack(tuple(convs), tuple(m.stride[0] for m in convs), acts[0], self.head)
