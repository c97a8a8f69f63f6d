"""Energy matching (Balcerak et al. 2025): one scalar potential ``V(x)`` trained first as an optimal-transport flow
(its negative gradient carries noise to data), then also contrastively, so that ``exp(−V/ε)`` is the data's
density at the temperature ``ε``; and its special case, a flow-matching warm-up followed by contrastive divergence.

- **Flow phase**: with noise ``x₀ ~ N(0, s²I)`` paired with data ``x₁`` (independently, or by a mini-batch optimal
  transport plan from POT), ``t ~ U[0, 1]`` and ``x_t = (1 − t)x₀ + t·x₁``, the loss is
  ``L_OT = mean ‖∇V(x_t) + (x₁ − x₀)‖²``: the time-independent field ``−∇V`` matches the straight-line velocity.
- **Contrastive phase** (after ``flow_steps`` calls): ``L = flow_weight·L_OT + (mean V(x⁺) − mean V(x⁻))/ε
  + α·mean(V(x⁺)² + V(x⁻)²)``, the negatives ``x⁻`` from ``n_steps`` of Langevin at temperature ``ε`` started at the
  data (they target ``exp(−V/ε)``). ``flow_weight = 0`` is a flow-matching warm-up followed by plain CD.
- **Sampling** (:func:`generate`): ``x ← x − ∇V(x)·dt + √(2ε(t)dt)·ξ`` from noise over ``t ∈ [0, 1]``, with the
  temperature schedule ``ε(t) = 0`` up to ``τ*`` and rising linearly to ``ε`` at ``t = 1``.

The model's density is ``exp(−V(x)/ε)``: :class:`BoltzmannEnergy` is that energy, for AIS and quadrature.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyModel, Loss
from ebmcore.errors import InputError
from ebmcore.validation import check_count, check_energy_output, check_generator, check_number, check_positive, check_start

__all__ = ["ot_pairing", "check_tau_star", "EnergyMatching", "BoltzmannEnergy", "generate", "COUPLINGS"]

COUPLINGS = ("independent", "ot")


def ot_pairing(noise: Tensor, data: Tensor) -> Tensor:
    """The mini-batch optimal-transport pairing: the permutation ``π: (n,)`` minimising ``Σ‖noise[i] − data[π[i]]‖²``,
    from POT's exact solver (``ot.emd``; with uniform weights on equal batches its plan is a permutation).
    ``noise, data: (n, *event_shape)``."""
    try:
        import ot
    except ImportError:
        raise InputError(
            "coupling='ot' needs POT (Python Optimal Transport): pip install 'ebm-losses[ot]', or use coupling='independent'."
        ) from None
    a, b = noise.detach().flatten(1).double().cpu(), data.detach().flatten(1).double().cpu()
    cost = torch.cdist(a, b).square().numpy()
    n = a.shape[0]
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64).numpy()
    plan = torch.from_numpy(ot.emd(weights, weights, cost))
    return plan.argmax(1).to(data.device)


def check_tau_star(tau_star: Any) -> float:
    """``τ*``, the time at which :func:`generate`'s temperature starts to rise: a finite number in ``[0, 1]``."""
    return check_number(tau_star, "tau_star", minimum=0, maximum=1)


class EnergyMatching(Loss):
    """``EnergyMatching(flow_steps=1000, *, temperature=0.1, coupling="ot", flow_weight=1.0, n_steps=20,
    step_size=0.01, source_scale=1.0, regularization=0.0, tau_star=0.9, sample_steps=200)``: the flow phase for
    ``flow_steps`` calls, then the contrastive phase (module docstring); :meth:`generate` samples with ``tau_star``
    and ``sample_steps``. The call count is the loss's state (checkpoints resume it).
    ``last_negatives`` keeps the contrastive phase's negatives, for the training watchdog."""

    def __init__(
        self,
        flow_steps: int = 1000,
        *,
        temperature: float = 0.1,
        coupling: str = "ot",
        flow_weight: float = 1.0,
        n_steps: int = 20,
        step_size: float = 0.01,
        source_scale: float = 1.0,
        regularization: float = 0.0,
        tau_star: float = 0.9,
        sample_steps: int = 200,
    ) -> None:
        if not isinstance(flow_steps, int) or isinstance(flow_steps, bool) or flow_steps < 0:
            raise InputError(f"flow_steps must be an integer >= 0, got {flow_steps!r}.")
        if coupling not in COUPLINGS:
            raise InputError(f"unknown coupling {coupling!r}; choose one of {', '.join(COUPLINGS)}.")
        if coupling == "ot":
            ot_pairing(torch.zeros(1, 1), torch.zeros(1, 1))  # POT installed? say so now, not at the first step
        if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
            raise InputError(f"n_steps must be a positive integer, got {n_steps!r}.")
        self.flow_steps, self.coupling, self.n_steps = flow_steps, coupling, n_steps
        self.temperature = check_positive(temperature, "temperature")
        self.step_size = check_positive(step_size, "step_size")
        self.source_scale = check_positive(source_scale, "source_scale")
        self.flow_weight = check_number(flow_weight, "flow_weight", minimum=0)
        self.regularization = check_number(regularization, "regularization", minimum=0)
        self.tau_star = check_tau_star(tau_star)
        if not isinstance(sample_steps, int) or isinstance(sample_steps, bool) or sample_steps < 1:
            raise InputError(f"sample_steps must be a positive integer, got {sample_steps!r}.")
        self.sample_steps = sample_steps
        self.calls = 0
        self.last_negatives: Tensor | None = None

    def generate(self, energy: EnergyModel, n: int, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``n`` samples ``(n, *like.shape[1:])`` by :func:`generate` from the training's noise ``N(0, s²I)``, with
        this loss's temperature, ``tau_star`` and ``sample_steps`` (what ``ebm train`` draws for an image report)."""
        check_generator(generator, like, name="like")
        x0 = self.source_scale * torch.randn((n, *like.shape[1:]), generator=generator, dtype=like.dtype, device=like.device)
        return generate(
            energy, x0, n_steps=self.sample_steps, temperature=self.temperature, tau_star=self.tau_star, generator=generator
        )

    @property
    def phase(self) -> str:
        """``"flow"`` for the first ``flow_steps`` calls, then ``"contrastive"``."""
        return "flow" if self.calls < self.flow_steps else "contrastive"

    def flow_loss(self, energy: EnergyModel, data: Tensor, generator: torch.Generator | None) -> Tensor:
        """``L_OT = mean ‖∇V(x_t) + (x₁ − x₀)‖²`` (summed over event dimensions) for ``data: (n, *event_shape)``."""
        x1 = data.detach()
        x0 = self.source_scale * torch.randn(x1.shape, generator=generator, dtype=x1.dtype, device=x1.device)
        if self.coupling == "ot":
            x1 = x1[ot_pairing(x0, x1)]
        t = torch.rand((x1.shape[0],), generator=generator, dtype=x1.dtype, device=x1.device)
        t = t.view(-1, *([1] * (x1.dim() - 1)))
        xt = ((1 - t) * x0 + t * x1).requires_grad_(True)
        v = check_energy_output(energy.compute_energy(xt), xt, owner=type(energy).__name__)
        (grad,) = torch.autograd.grad(v.sum(), xt, create_graph=True)
        return (grad + (x1 - x0)).flatten(1).square().sum(1).mean()

    def negatives(self, energy: EnergyModel, data: Tensor, generator: torch.Generator | None) -> Tensor:
        """``n_steps`` of unadjusted Langevin at the temperature ``ε`` from the data: ``x ← x − h∇V + √(2hε)ξ``."""
        x = data.detach().clone()
        noise = math.sqrt(2 * self.step_size * self.temperature)
        for _ in range(self.n_steps):
            with torch.enable_grad():
                xg = x.requires_grad_(True)
                (grad,) = torch.autograd.grad(energy.compute_energy(xg).sum(), xg)
            x = (
                x.detach()
                - self.step_size * grad
                + noise * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
            )
        return x.detach()

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        phase = self.phase
        self.calls += 1
        if phase == "flow":
            return self.flow_loss(energy, data, generator)
        negatives = self.negatives(energy, data, generator)
        self.last_negatives = negatives
        both = torch.cat([data.detach(), negatives])
        v = check_energy_output(energy.compute_energy(both), both, owner=type(energy).__name__)
        positive, negative = v[: data.shape[0]], v[data.shape[0] :]
        loss = (positive.mean() - negative.mean()) / self.temperature
        if self.regularization:
            loss = loss + self.regularization * (positive.square().mean() + negative.square().mean())
        if self.flow_weight:
            loss = loss + self.flow_weight * self.flow_loss(energy, data, generator)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"calls"}:
            raise InputError(f"EnergyMatching keeps {{'calls'}}, got keys {sorted(state)}; is this checkpoint from another loss?")
        self.calls = int(state["calls"])


class BoltzmannEnergy(EnergyModel):
    """``V(x)/ε``: the energy whose density ``exp(−V/ε)`` energy matching models, for AIS and quadrature. It shares
    ``potential``'s parameters. ``x: (n, *event_shape) -> (n,)``."""

    def __init__(self, potential: EnergyModel, temperature: float) -> None:
        super().__init__()
        self.potential = potential
        self.temperature = check_positive(temperature, "temperature")
        self.event_shape = tuple(getattr(potential, "event_shape", ()) or ())

    def compute_energy(self, x: Tensor) -> Tensor:
        return self.potential.compute_energy(x) / self.temperature


def generate(
    energy: EnergyModel,
    x0: Tensor,
    *,
    n_steps: int = 200,
    temperature: float = 0.1,
    tau_star: float = 0.9,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Energy matching's sampler: ``x ← x − ∇V(x)·dt + √(2ε(t)dt)·ξ`` over ``t ∈ [0, 1]`` in ``n_steps`` steps from
    ``x0: (n, *event_shape)`` (noise like the training's source), with ``ε(t) = 0`` for ``t < τ*`` and rising
    linearly to ``temperature`` at ``t = 1``. Returns ``(n, *event_shape)``, detached."""
    check_count(n_steps, "n_steps", minimum=1)
    check_positive(temperature, "temperature")
    tau_star = check_tau_star(tau_star)
    check_generator(generator, x0)
    dt = 1.0 / n_steps
    x = check_start(energy, x0).detach().clone()
    for k in range(n_steps):
        t = k * dt
        eps = 0.0 if t < tau_star or tau_star >= 1 else temperature * (t - tau_star) / (1 - tau_star)
        with torch.enable_grad():
            xg = x.requires_grad_(True)
            (grad,) = torch.autograd.grad(energy.compute_energy(xg).sum(), xg)
        x = x.detach() - dt * grad
        if eps > 0:
            x = x + math.sqrt(2 * eps * dt) * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return x.detach()
