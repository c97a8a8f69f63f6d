"""Joint energy models (JEM; Grathwohl et al. 2020, "Your classifier is secretly an energy based model").

One network's logits ``f(x): (n, K)`` give the classifier ``p(y|x) = softmax f(x)``, the class-conditional energy
``E(x, y) = −f(x)[y]`` and the marginal energy ``E(x) = −logsumexp_y f(x)[y]``, so ``p(x, y) ∝ exp(f(x)[y])`` and
``p(x) ∝ exp(−E(x))``. The ``jem`` loss is cross-entropy on labelled data plus ``generative_weight`` times persistent
contrastive divergence on ``E(x)`` (SGLD negatives from a replay buffer, or any registered sampler's).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ebmcore import EnergyModel, registry
from ebmcore.energies.mlp import ACTIVATIONS
from ebmcore.errors import InputError
from ebmcore.validation import check_number
from ebm_losses.contrastive_divergence import PersistentContrastiveDivergence, SamplerSpec

__all__ = ["JointEnergy", "ClassConditionalEnergy", "JointEnergyLoss", "check_labels", "sample_classes"]


def _positive_ints(value: Any, name: str, allow_empty: bool = False) -> tuple[int, ...]:
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if (not values and not allow_empty) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise InputError(f"JointEnergy: {name} must be positive integers, got {value!r}.")
    return values


class JointEnergy(EnergyModel):
    """``JointEnergy(event_shape=(1, 8, 8), n_classes=10, hidden=(256, 256), widths=(), activation="silu", seed=0)``.

    The logits ``f(x): (n, K)`` come from ``len(widths)`` 3×3 convolutions (stride 1, then 2; images ``(C, H, W)``
    only), flattened, then a perceptron with ``hidden`` widths; without ``widths``, from the perceptron on the
    flattened ``x``. ``compute_energy(x) = −logsumexp f(x): (n,)``; :meth:`class_energy` is ``E(x, y) = −f(x)[y]``.
    ``seed`` fills every weight from a local generator, ``U(±1/√fan_in)`` (the global RNG is untouched)."""

    def __init__(
        self,
        event_shape: Sequence[int] = (1, 8, 8),
        n_classes: int = 10,
        hidden: Sequence[int] = (256, 256),
        widths: Sequence[int] = (),
        activation: str = "silu",
        *,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        shape = _positive_ints(event_shape, "event_shape")
        widths = _positive_ints(widths, "widths", allow_empty=True)
        hidden = _positive_ints(hidden, "hidden", allow_empty=True)
        if not isinstance(n_classes, int) or isinstance(n_classes, bool) or n_classes < 2:
            raise InputError(f"JointEnergy: n_classes must be an integer ≥ 2, got {n_classes!r}.")
        if activation not in ACTIVATIONS:
            raise InputError(f"JointEnergy: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
        if widths and len(shape) != 3:
            raise InputError(
                f"JointEnergy: convolutions (widths) need images of shape (C, H, W), got event_shape {shape}; "
                "set widths = [] for a perceptron."
            )
        self.event_shape, self.n_classes = shape, n_classes
        build_on = "meta" if seed is not None else None  # seeded: no draw from the global RNG
        layers: list[nn.Module] = []
        features, h, w = math.prod(shape), *(shape[1:] if widths else (1, 1))
        for i, (c_in, c_out) in enumerate(zip([shape[0], *widths], widths)):
            layers += [nn.Conv2d(c_in, c_out, 3, 1 if i == 0 else 2, 1, device=build_on), ACTIVATIONS[activation]()]
            h, w = (h, w) if i == 0 else ((h + 1) // 2, (w + 1) // 2)  # a 3×3 convolution of stride 2, padding 1
            features = c_out * h * w
        layers.append(nn.Flatten())
        for fan_in, fan_out in zip([features, *hidden], hidden):
            layers += [nn.Linear(fan_in, fan_out, device=build_on), ACTIVATIONS[activation]()]
        layers.append(nn.Linear(hidden[-1] if hidden else features, n_classes, device=build_on))
        self.net = nn.Sequential(*layers)
        if seed is not None:
            self.net.to_empty(device="cpu")
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for layer in self.net:
                    if isinstance(layer, (nn.Conv2d, nn.Linear)):
                        bound = layer.weight[0].numel() ** -0.5
                        for p in (layer.weight, layer.bias):
                            p.copy_((torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound)

    def logits(self, x: Tensor) -> Tensor:
        """``f(x)``: ``x: (n, *event_shape) -> (n, K)``."""
        if tuple(x.shape[1:]) != self.event_shape:
            raise InputError(
                f"JointEnergy: x has event shape {tuple(x.shape[1:])}, the energy {self.event_shape}; "
                f"give x of shape (n, {', '.join(map(str, self.event_shape))})."
            )
        return self.net(x)

    def compute_energy(self, x: Tensor) -> Tensor:
        """``E(x) = −logsumexp_y f(x)[y]``: ``(n,)``."""
        return -torch.logsumexp(self.logits(x), -1)

    def class_energy(self, x: Tensor, y: Tensor | int) -> Tensor:
        """``E(x, y) = −f(x)[y]``: ``(n,)``, for labels ``y: (n,)`` or one class for every row."""
        logits = self.logits(x)
        y = check_labels(torch.full((len(x),), y, device=x.device) if isinstance(y, int) else y, len(x), self.n_classes)
        return -logits.gather(1, y.to(x.device).unsqueeze(1)).squeeze(1)

    def predict_proba(self, x: Tensor) -> Tensor:
        """``p(y|x) = softmax f(x)``: ``(n, K)``."""
        return torch.softmax(self.logits(x), -1)


def check_labels(labels: Any, n: int, n_classes: int, *, what: str = "labels") -> Tensor:
    """``labels`` as class indices ``(n,)`` in ``[0, n_classes)``, or an :class:`InputError` naming the fix."""
    if labels is None:
        raise InputError(
            f"{what} are missing: JEM trains p(y|x) on labelled data; pass Trainer(..., labels=y) "
            "with y: (N,) integer class indices (ebm train: a labelled [data] dataset, \"digits\")."
        )
    if not isinstance(labels, Tensor):
        raise InputError(f"{what} must be a tensor of class indices, got {type(labels).__name__}; use torch.as_tensor(y).")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise InputError(
            f"{what} must be integer class indices (torch.long), got {labels.dtype}; convert them with y.long() "
            "(one-hot labels: y.argmax(1))."
        )
    if labels.shape != (n,):
        raise InputError(f"{what} must have shape ({n},), one class index per row of the data, got {tuple(labels.shape)}.")
    low, high = torch.stack(labels.aminmax()).tolist() if n else (0, 0)  # one host sync for both
    if low < 0 or high >= n_classes:
        hint = " (labels from 1: use y - 1)" if low >= 1 and high == n_classes else ""
        raise InputError(
            f"{what} must be in [0, {n_classes}) for {n_classes} classes, got values in [{low}, {high}]{hint}; "
            "or set the energy's n_classes to the number of classes."
        )
    return labels.long()


class ClassConditionalEnergy(EnergyModel):
    """``E(x, y)`` of a :class:`JointEnergy` for fixed labels ``y`` (an int, or ``(n,)`` for ``n`` chains): a view
    for samplers (``p(x|y) ∝ exp(f(x)[y])``). It references ``joint`` without owning it."""

    def __init__(self, joint: EnergyModel, y: Tensor | int) -> None:
        super().__init__()
        if not callable(getattr(joint, "logits", None)):
            raise InputError(
                f"ClassConditionalEnergy needs an energy with logits(x) -> (n, K), such as JointEnergy, got {joint!r}."
            )
        object.__setattr__(self, "_joint", joint)  # not a submodule: no ownership
        self.event_shape = joint.event_shape
        k = getattr(joint, "n_classes", None) or 2**62
        if isinstance(y, int) and not isinstance(y, bool):
            check_labels(torch.tensor([y]), 1, k, what="y")
            self.y: Tensor | int = y
        else:
            self.y = check_labels(y, len(y) if isinstance(y, Tensor) else 0, k, what="y")

    def _reference_tensor(self) -> Tensor | None:
        return self._joint._reference_tensor()

    def compute_energy(self, x: Tensor) -> Tensor:
        logits = self._joint.logits(x)
        if isinstance(self.y, int):
            return -logits[:, self.y]
        if len(self.y) != len(x):
            raise InputError(f"ClassConditionalEnergy: {len(self.y)} labels for {len(x)} chains; give one label per chain.")
        return -logits.gather(1, self.y.to(x.device).unsqueeze(1)).squeeze(1)


def sample_classes(
    energy: EnergyModel,
    labels: Tensor,
    start: Tensor,
    n_steps: int,
    *,
    sampler: str = "langevin",
    sampler_options: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Class-conditional samples ``(n, *event_shape)``: ``n_steps`` of the registered ``sampler`` on ``E(x, y)``
    (Langevin ``x − h∇ₓE(x, y) + √(2h)ξ`` by default) from ``start: (n, *event_shape)``, chain ``i`` for class
    ``labels[i]``."""
    view = ClassConditionalEnergy(energy, check_labels(labels, len(start), getattr(energy, "n_classes", 2**62)))
    chains = registry.get("sampler", sampler)(view, **dict(sampler_options or {}))
    return chains.sample(start, n_steps, generator=generator).detach()


class JointEnergyLoss(PersistentContrastiveDivergence):
    """``jem``: ``CE(f(x⁺), y) + generative_weight·(mean E(x⁺) − mean E(x⁻) + α·mean(E(x⁺)² + E(x⁻)²))``.

    The first term trains ``p(y|x)``, the second ``p(x) ∝ exp(−E(x))`` by persistent contrastive divergence
    (:class:`~ebm_losses.PersistentContrastiveDivergence`: the negatives ``x⁻`` are ``n_steps`` of ``sampler`` from a
    replay buffer of ``buffer_size`` chains, ``reinit_fraction`` restarted from noise each step; JEM's SGLD is
    ``langevin`` with ``step_size = 1, noise_scale = 0.01``). ``generative_weight = 0`` is the classifier alone:
    cross-entropy, no sampling. Called as ``loss(energy, x, labels=y)``; the energy must have ``logits(x)``."""

    needs_labels = True

    def __init__(
        self,
        sampler: SamplerSpec = "langevin",
        n_steps: int = 20,
        *,
        generative_weight: float = 1.0,
        buffer_size: int = 10_000,
        reinit_fraction: float = 0.05,
        noise: str | Callable[..., Tensor] = "uniform",
        sampler_options: dict[str, Any] | None = None,
        regularization: float = 0.0,
        gradient_clip: float | None = None,
    ) -> None:
        super().__init__(
            sampler,
            n_steps,
            buffer_size=buffer_size,
            reinit_fraction=reinit_fraction,
            noise=noise,
            sampler_options=sampler_options,
            regularization=regularization,
            gradient_clip=gradient_clip,
        )
        self.generative_weight = check_number(generative_weight, "generative_weight", minimum=0)
        self.last_cross_entropy: Tensor | None = None

    def __call__(
        self, energy: EnergyModel, data: Tensor, *, labels: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        self.check_data(energy, data, generator=generator)
        if not callable(getattr(energy, "logits", None)):
            raise InputError(
                f"jem needs an energy whose logits(x) -> (n, K) give p(y|x), such as JointEnergy ([model] energy = "
                f'"joint_energy"), got {type(energy).__name__}.'
            )
        logits = energy.logits(data)
        k = logits.shape[-1]
        if getattr(energy, "n_classes", k) != k or logits.shape != (len(data), k):
            raise InputError(
                f"{type(energy).__name__}.logits(x) must return (n, K) = ({len(data)}, n_classes), got {tuple(logits.shape)}."
            )
        y = check_labels(labels, len(data), k).to(logits.device)
        loss = F.cross_entropy(logits, y)
        self.last_cross_entropy = loss.detach()
        if not self.generative_weight:
            return loss
        starts = self._starts(data, generator)
        negatives = self.negatives(energy, starts, generator)
        self._after(negatives)
        self.last_negatives = negatives
        e_pos = -torch.logsumexp(logits, -1)
        e_neg = energy.compute_energy(negatives)
        return loss + self.generative_weight * self._value(e_pos, e_neg)
