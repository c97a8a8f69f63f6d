"""Contrastive divergence: CD-k with chains started at the data, and persistent CD with a replay buffer.

The loss is ``mean E(x⁺) − mean E(x⁻) + α·mean(E(x⁺)² + E(x⁻)²)``: its gradient lowers the energy of
data ``x⁺`` and raises that of negatives ``x⁻`` drawn by ``n_steps`` of any registered sampler
(Du & Mordatch 2019 add the ``α`` term to keep energies small).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Loss, Sampler, registry
from ebmcore.energies.base import closed_form_program
from ebmcore.energies.program import FeedForward
from ebmcore.errors import InputError
from ebmcore.sampler import Planned
from ebmcore.validation import check_energy_output, check_number, check_positive
from ebm_losses.network_kernels import kernel_loss, kernel_may_run, network_kernel
from ebm_samplers.langevin import ULAChain

__all__ = ["ContrastiveDivergence", "PersistentContrastiveDivergence", "ClippedGradientEnergy"]


class ClippedGradientEnergy(EnergyModel):
    """A view of ``base`` whose gradient is clamped to ``[-clip, clip]`` elementwise (for sampling only).

    It references ``base`` without owning it (not a submodule). Clipping changes the dynamics:
    use it with ULA negatives, as in Du & Mordatch (2019), not with MALA/HMC.
    """

    def __init__(self, base: EnergyModel, clip: float) -> None:
        super().__init__()
        object.__setattr__(self, "_base", base)  # not registered as a submodule: no ownership
        self.event_shape = base.event_shape
        self.clip = check_positive(clip, "gradient_clip")

    def _reference_tensor(self) -> Tensor | None:
        return self._base._reference_tensor()

    def compute_energy(self, x: Tensor) -> Tensor:
        return self._base.compute_energy(x)

    def _clip_for(self, x: Tensor) -> float:
        """The clip in ``x``'s dtype's range (clamping at a larger one is the same, and would not convert)."""
        return min(self.clip, torch.finfo(x.dtype).max)

    def compute_gradient(self, x: Tensor, create_graph: bool = False) -> Tensor:
        clip = self._clip_for(x)
        return self._base.compute_gradient(x, create_graph).clamp(-clip, clip)

    def bind(self, like: Tensor) -> EnergyFunctions:
        fns = self._base.bind(like)
        clip = self._clip_for(like)

        def energy_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
            e, g = fns.energy_and_gradient(x)
            return e, g.clamp(-clip, clip)  # out of place: a gradient may alias the energy's own tensors

        return EnergyFunctions(
            fns.energy,
            lambda x: fns.gradient(x).clamp(-clip, clip),
            energy_and_gradient,
            f"{fns.path or 'gradient'}, clamped to ±{clip}",
        )


@dataclass(frozen=True)
class _ChainLoss:
    """What ``feedforward_contrastive_chain`` computed with the negatives: the loss ``()`` and its gradient in each
    layer's weight and bias (None where a layer has no bias) of the energy's feed-forward ``plan``."""

    negatives: Tensor
    loss: Tensor
    plan: FeedForward
    weight_grads: list[Tensor]
    bias_grads: list[Optional[Tensor]]


SamplerSpec = Any  # a registered name, a Sampler built on the energy, or a factory energy -> Sampler


class ContrastiveDivergence(Loss):
    """CD-k: negatives from ``n_steps`` of ``sampler`` started at the data batch.

    ``sampler`` is a registered name (built on the energy with ``sampler_options``), a ready
    :class:`ebmcore.Sampler`, or a factory ``energy -> Sampler``. ``regularization`` is ``α``;
    ``gradient_clip`` clamps the gradient the sampler sees. ``last_negatives`` keeps the most
    recent negatives ``(batch, *event_shape)``. ``precision``: the products of the sampler's fused chain and of the
    chain that computes this loss with it (ebm-cuda's Triton kernels: ``"ieee"``, ``"tf32x3"``, ``"tf32"``,
    ``"bf16"``; None: torch's switch for float32 products), given to a sampler built by name.
    """

    def __init__(
        self,
        sampler: SamplerSpec = "langevin",
        n_steps: int = 10,
        *,
        sampler_options: dict[str, Any] | None = None,
        regularization: float = 0.0,
        gradient_clip: float | None = None,
        precision: str | None = None,
    ) -> None:
        if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
            raise InputError(f"n_steps must be a positive integer, got {n_steps!r}.")
        if not isinstance(sampler, (str, Sampler)) and not callable(sampler):
            raise InputError(f"sampler must be a registered name, an ebmcore.Sampler or a factory, got {sampler!r}.")
        self.sampler_spec = sampler
        self.n_steps = n_steps
        self.sampler_options = dict(sampler_options or {})
        if precision is not None:
            if not isinstance(sampler, str) or self.sampler_options.get("precision", precision) != precision:
                raise InputError(
                    f"precision={precision!r} is given to the sampler contrastive divergence builds by name; a sampler "
                    f"given ready-made (or sampler_options' own precision) sets its own: pass it there."
                )
            self.sampler_options["precision"] = precision
        self.regularization = check_number(regularization, "regularization", minimum=0)
        self.gradient_clip = None if gradient_clip is None else check_positive(gradient_clip, "gradient_clip")
        self.last_negatives: Tensor | None = None
        self._cache: tuple[EnergyModel, Sampler] | None = None  # (the energy, its sampler): identity, not id()

    def sampler_for(self, energy: EnergyModel) -> Sampler:
        """The sampler that draws negatives for ``energy`` (built once per energy and cached)."""
        if isinstance(self.sampler_spec, Sampler):
            return self.sampler_spec
        if self._cache is not None and self._cache[0] is energy:
            return self._cache[1]
        target = energy if self.gradient_clip is None else ClippedGradientEnergy(energy, self.gradient_clip)
        if isinstance(self.sampler_spec, str):
            sampler = registry.get("sampler", self.sampler_spec)(target, **self.sampler_options)
        else:
            sampler = self.sampler_spec(target)
        self._cache = (energy, sampler)
        return sampler

    def negatives(self, energy: EnergyModel, start: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Run the sampler from ``start`` (the data, or chains kept from past steps) and return detached
        negatives: ``Sampler.advance``, the samples ``sample`` would give, without the forward pass it makes
        only to check the energy at the starts (a non-finite energy shows in the loss, which training checks).
        A subclass may override it; the loss then takes the negatives it returns."""
        return self._draw(energy, start, generator, None)[0]

    def _draw(
        self, energy: EnergyModel, start: Tensor, generator: torch.Generator | None, data: Tensor | None
    ) -> tuple[Tensor, _ChainLoss | None]:
        """:meth:`negatives`, planned once (``Sampler.plan``), and where the chains start at ``data`` and the planned
        run's chain is ULA on a feed-forward network (a ``ULAChain``), drawn by ``feedforward_contrastive_chain``,
        which computes this loss and its weight gradient in the same launch: then with what it computed."""
        planned = self.sampler_for(energy).plan(start.detach(), self.n_steps, generator=generator)
        fused = self._contrastive_chain(energy, planned) if data is not None and start is data else None
        if fused is not None:
            return fused.negatives, fused
        return planned.advance().detach(), None

    def _contrastive_chain(self, energy: EnergyModel, planned: Planned) -> _ChainLoss | None:
        """The negatives of ``planned`` with :meth:`_value`'s loss ``Σ ±Eᵣ/n + (regularization/n)·Eᵣ²`` and its
        weight gradient, in one ``feedforward_contrastive_chain`` launch: the moves and stream of the planned ULA
        chain, so the negatives equal ``planned.advance()``'s to the bit; None where it cannot run (another chain,
        the sampler's own ``sample``/``advance``, a sampler on another energy than this loss's, such as a clipped
        view, or no such op in the chain's backend)."""
        run, x, sampler = planned.run, planned.x, planned.sampler
        chain = run.chain if run is not None else None
        if not (
            isinstance(chain, ULAChain)
            and isinstance(chain.program, FeedForward)
            and kernel_may_run(x)
            and getattr(sampler, "energy", None) is energy
        ):
            return None
        # from the backend whose chain the sampler runs: another's stream or rounding would give other negatives
        kernel = network_kernel("feedforward_contrastive_chain", chain.program, x, chain.backend)
        if kernel is None:
            return None
        # the chain's own products (ebm-cuda's Triton kernels declare them); where the contrastive kernel does not run
        # with them at fused=None (not measured faster, or not yet run on a GPU), or does not take them (the host's
        # contrastive chain: float32 products only), the chain and the loss run apart
        declared = getattr(kernel.fn, "products", None)
        if chain.kernel.products is not None:
            if declared is None:
                return None
            if declared(chain.kernel.products)[1] is not None and getattr(sampler, "fused", None) is not True:
                return None
        n = len(x)
        b = 2.0 * self.regularization / n if self.regularization else None
        negatives, _, _, loss, weight_grads, bias_grads = kernel.fn(
            x,
            chain.program,
            n_steps=self.n_steps,
            step_size=chain.step_size,
            noise_scale=chain.noise_scale,
            seed=planned.seed,
            offset=0,
            start=(1.0 / n, b),
            end=(-1.0 / n, b),
            **chain.kernel.options,
        )
        sampler.warn_nonfinite(negatives)
        return _ChainLoss(negatives, loss, chain.program, weight_grads, bias_grads)

    def _starts(self, data: Tensor, generator: torch.Generator | None) -> Tensor:
        return data

    def _after(self, negatives: Tensor) -> None:
        pass

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        starts = self._starts(data, generator)
        if type(self).negatives is ContrastiveDivergence.negatives:  # may be drawn with this loss (see _draw)
            negatives, fused = self._draw(energy, starts, generator, data)
        else:
            negatives, fused = self.negatives(energy, starts, generator), None
        self._after(negatives)
        self.last_negatives = negatives
        n_pos = len(data)
        plan_loss = lambda: self._value(*energy.compute_energy(torch.cat((data, negatives))).split((n_pos, len(negatives))))  # noqa: E731
        if fused is not None:  # the chain that drew the negatives computed this loss
            return kernel_loss(fused.plan, fused.loss, fused.weight_grads, fused.bias_grads, recompute=plan_loss)
        plan = closed_form_program(energy, data)[0]
        if plan is not None:  # rows independent, output (n,): one pass over both batches
            both = torch.cat((data, negatives))
            kernel = network_kernel("feedforward_energy_gradients", plan, both)
            if kernel is None:
                return plan_loss()
            return self._kernel_loss(kernel, plan, both, n_pos, plan_loss)  # ebm-cuda: energies and gradient natively
        owner = type(energy).__name__  # the model may mix rows (batch norm): each batch on its own
        e_pos = check_energy_output(energy.compute_energy(data), data, owner=owner)
        e_neg = check_energy_output(energy.compute_energy(negatives), negatives, owner=owner)
        return self._value(e_pos, e_neg)

    def _value(self, e_pos: Tensor, e_neg: Tensor) -> Tensor:
        """``mean E(x⁺) − mean E(x⁻)`` (+ ``regularization · (mean E(x⁺)² + mean E(x⁻)²)``)."""
        loss = e_pos.mean() - e_neg.mean()
        if self.regularization:
            loss = loss + self.regularization * (e_pos.square().mean() + e_neg.square().mean())
        return loss

    def _kernel_loss(self, kernel: Any, plan: FeedForward, both: Tensor, n_pos: int, recompute: Callable[[], Tensor]) -> Tensor:
        """The loss of :meth:`_value` by ``feedforward_energy_gradients``: ``∂loss/∂Eᵣ = aᵣ + bᵣEᵣ`` with ``a = ±1/n``
        and ``b = 2·regularization/n`` for the rows of each batch."""
        n_neg = both.shape[0] - n_pos
        sign = both.new_empty(both.shape[0])
        sign[:n_pos], sign[n_pos:] = 1.0 / n_pos, -1.0 / n_neg
        b = sign.abs() * (2.0 * self.regularization) if self.regularization else None
        energies, grad_w, grad_b = kernel.fn(both, sign, b, plan)
        return kernel_loss(plan, self._value(*energies.split((n_pos, n_neg))), grad_w, grad_b, recompute=recompute)


class PersistentContrastiveDivergence(ContrastiveDivergence):
    """Persistent CD: chains continue from a replay buffer of past negatives.

    Each call draws the batch's starts from the buffer (``buffer_size`` states), restarts a
    ``reinit_fraction`` of them from noise, samples, and writes the negatives back. Noise is
    uniform over the first data batch's per-dimension range widened by 10 % (``noise="uniform"``),
    ``"gaussian"`` (that batch's mean and std), or a callable ``(n, like, generator) -> Tensor``.
    The buffer and the noise range are part of :meth:`state_dict`.
    """

    def __init__(
        self,
        sampler: SamplerSpec = "langevin",
        n_steps: int = 10,
        *,
        buffer_size: int = 10_000,
        reinit_fraction: float = 0.05,
        noise: str | Callable[..., Tensor] = "uniform",
        sampler_options: dict[str, Any] | None = None,
        regularization: float = 0.0,
        gradient_clip: float | None = None,
        precision: str | None = None,
    ) -> None:
        super().__init__(
            sampler, n_steps, sampler_options=sampler_options, regularization=regularization, gradient_clip=gradient_clip
        )
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise InputError(f"buffer_size must be a positive integer, got {buffer_size!r}.")
        if not (isinstance(reinit_fraction, (int, float)) and 0 <= reinit_fraction <= 1):
            raise InputError(f"reinit_fraction must be in [0, 1], got {reinit_fraction!r}.")
        if noise not in ("uniform", "gaussian") and not callable(noise):
            raise InputError(f"noise must be 'uniform', 'gaussian' or a callable (n, like, generator) -> Tensor, got {noise!r}.")
        self.buffer_size = buffer_size
        self.reinit_fraction = float(reinit_fraction)
        self.noise = noise
        self.buffer: Tensor | None = None
        self.noise_location: Tensor | None = None
        self.noise_scale: Tensor | None = None
        self._indices: Tensor | None = None

    def _noise(self, n: int, like: Tensor, generator: torch.Generator | None) -> Tensor:
        if callable(self.noise):
            return self.noise(n, like, generator)
        draw = torch.rand if self.noise == "uniform" else torch.randn
        z = draw((n, *like.shape[1:]), generator=generator, dtype=like.dtype, device=like.device)
        if self.noise == "uniform":
            z = 2 * z - 1
        return self.noise_location + self.noise_scale * z

    def _starts(self, data: Tensor, generator: torch.Generator | None) -> Tensor:
        if self.buffer is None:
            flat = data.detach()
            if self.noise == "gaussian":
                self.noise_location, self.noise_scale = flat.mean(0), flat.std(0).clamp_min(1e-6)
            else:
                low, high = flat.min(0).values, flat.max(0).values
                self.noise_location, self.noise_scale = (low + high) / 2, 0.55 * (high - low).clamp_min(1e-6)
            self.buffer = self._noise(self.buffer_size, data, generator)
        n = data.shape[0]
        self._indices = torch.randint(0, self.buffer_size, (n,), generator=generator, device=data.device)
        starts = self.buffer[self._indices].clone()
        restart = torch.rand(n, generator=generator, device=data.device) < self.reinit_fraction
        fresh = self._noise(n, data, generator)
        return torch.where(restart.view(-1, *([1] * (data.dim() - 1))), fresh, starts)

    def _after(self, negatives: Tensor) -> None:
        self.buffer[self._indices] = negatives

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "noise_location": self.noise_location, "noise_scale": self.noise_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer = state["buffer"]
        self.noise_location = state["noise_location"]
        self.noise_scale = state["noise_scale"]
