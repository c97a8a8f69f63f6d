"""Equilibrium matching with an explicit energy (EqM-E): the truncated decay, a closed-form zero of the loss, and on
eight Gaussians the gradient-descent samples and the quadrature NLL of ``exp(−E/T)`` against the exact density."""

from __future__ import annotations

import math

import pytest
import torch

import ebmcore
from ebmcore.errors import InputError, NonFiniteError
from ebm_losses import EquilibriumMatching, Trainer, datasets, train_job
from ebm_losses.equilibrium_matching import descend
from loss_problems import shortened_config


def test_the_truncated_decay_is_flat_then_falls_to_zero_at_the_data():
    loss = EquilibriumMatching(a=0.8, multiplier=4.0)
    w = loss.weight(torch.tensor([0.0, 0.5, 0.8, 0.9, 1.0]))
    torch.testing.assert_close(w, torch.tensor([4.0, 4.0, 4.0, 2.0, 0.0]))
    with pytest.raises(InputError, match=r"a must lie in \[0, 1\)"):
        EquilibriumMatching(a=1.0)
    assert ebmcore.registry.get("loss", "equilibrium_matching").component is EquilibriumMatching


def test_descend_refuses_a_non_finite_start():
    x0 = torch.randn(4, 2)
    x0[1, 0] = math.inf
    with pytest.raises(NonFiniteError, match=r"initial state x0 is non-finite .* rows \[1\]\. Start every chain from a finite"):
        descend(ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0), x0, n_steps=3)


def test_the_loss_vanishes_for_the_exact_energy_of_a_point_mass():
    """With ``a = 0`` the target ``λ(1 − γ)(ε − m)`` at ``x_γ = γm + (1 − γ)ε`` is ``λ(x_γ − m)``: the gradient of
    ``E = ½λ‖x − m‖²``, so the loss is 0 for it, and ``4λ²·mean‖x_γ − m‖²`` for its negative."""
    m = torch.tensor([1.0, -2.0], dtype=torch.float64)
    exact = ebmcore.GaussianEnergy(m, covariance=torch.eye(2, dtype=torch.float64) / 3.0)  # ½·3‖x − m‖²
    data = m.repeat(256, 1)
    loss = EquilibriumMatching(a=0.0, multiplier=3.0)
    assert float(loss(exact, data, generator=torch.Generator().manual_seed(0)).detach()) == pytest.approx(0, abs=1e-20)


def _true_nll(test: torch.Tensor) -> float:
    angle = torch.arange(8, dtype=torch.float64) * (2 * math.pi / 8)
    centres = 2 * torch.stack([angle.cos(), angle.sin()], 1)
    d2 = ((test.double()[:, None, :] - centres) ** 2).sum(-1)
    return float(-(torch.logsumexp(-d2 / (2 * 0.04), 1) - math.log(8) - math.log(2 * math.pi * 0.04)).mean())


class _Tempered(ebmcore.EnergyModel):
    """``E(x)/T``: the density ``exp(−E/T)`` of an EqM energy at the temperature ``T``."""

    event_shape = (2,)

    def __init__(self, energy: ebmcore.EnergyModel, temperature: float) -> None:
        super().__init__()
        self.base, self.temperature = energy, temperature

    def compute_energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.base.compute_energy(x) / self.temperature


@pytest.fixture(scope="module")
def eight_gaussians_eqm():
    g = torch.Generator().manual_seed(0)
    train, test = datasets.make("eight_gaussians", 8000, generator=g), datasets.make("eight_gaussians", 2000, generator=g)
    energy = ebmcore.MLPEnergy(dim=2, hidden=(128, 128), seed=0)
    trainer = Trainer(energy, EquilibriumMatching(), train, batch_size=256, lr=2e-3, seed=0, ema_decay=0.99)
    trainer.fit(3000)  # about 8 s on one thread
    return trainer.ema.module, train, test


def test_gradient_descent_on_the_energy_carries_noise_to_every_mode(eight_gaussians_eqm):
    energy, _, _ = eight_gaussians_eqm
    x = descend(energy, torch.randn(4000, 2, generator=torch.Generator().manual_seed(1)), n_steps=200, step_size=0.01)
    angle = torch.arange(8) * (2 * math.pi / 8)
    centres = 2 * torch.stack([angle.cos(), angle.sin()], 1)
    nearest = torch.cdist(x, centres).argmin(1)
    counts = torch.bincount(nearest, minlength=8)
    assert int(counts.min()) > 0.6 * 500 and int(counts.max()) < 1.4 * 500  # measured 383 to 612
    assert abs(float(x.norm(dim=1).mean()) - 2.0) < 0.2  # measured 2.10
    assert float((x - centres[nearest]).norm(dim=1).median()) < 0.5  # measured 0.38; the data's 0.24


def test_the_energy_at_its_best_temperature_is_a_density_within_the_stated_gap(eight_gaussians_eqm):
    """EqM's energy is not trained as a log-density: ``exp(−E/T)`` with ``T`` chosen on the training split (by
    quadrature NLL, over 0.05 … 1) scores 2.43 nats on held-out points (T = 0.5) against the true 1.71, a gap of
    0.72 nats, which the test holds under 0.9."""
    energy, train, test = eight_gaussians_eqm
    temperatures = (0.05, 0.1, 0.2, 0.5, 1.0)
    best = min(temperatures, key=lambda t: train_job.grid_nll(_Tempered(energy, t), train, 4.0, n=300))
    model, exact = train_job.grid_nll(_Tempered(energy, best), test, 4.0, n=300), _true_nll(test)
    assert exact <= model + 0.02 and model - exact < 0.9


def test_image_mlp_is_an_mlp_of_the_flattened_pixels():
    from ebm_losses.image_mlp import ImageMLPEnergy

    energy = ImageMLPEnergy([1, 4, 4], hidden=[8], seed=0)
    x = torch.randn(5, 1, 4, 4)
    torch.testing.assert_close(energy.compute_energy(x), energy.flat.compute_energy(x.flatten(1)))
    assert ebmcore.registry.get("energy", "image_mlp").component is ImageMLPEnergy
    with pytest.raises(InputError, match=r"give x of shape \(n, 1, 4, 4\)"):
        energy.compute_energy(torch.randn(5, 16))


def _short_digits_eqm(tmp_path, steps: int = 20):
    """The bundled ``digits_eqm`` configuration, shortened to seconds."""
    changes = [
        ("steps = 15000", f"steps = {steps}"),
        ("hidden = [256, 256]", "hidden = [32]"),
        ("sample_steps = 200", "sample_steps = 7"),
        ("image_samples = 400", "image_samples = 50"),
        ("ais_chains = 128", "ais_chains = 0"),
        ("plots = true", "plots = false"),
    ]
    return shortened_config("digits_eqm", changes, tmp_path / "digits_eqm.toml")


def test_train_digits_eqm_draws_its_samples_by_the_losss_descent(tmp_path, monkeypatch):
    import json

    from ebmcore.cli import main
    from ebm_losses import equilibrium_matching

    calls = []
    real = equilibrium_matching.descend
    monkeypatch.setattr(equilibrium_matching, "descend", lambda *a, **k: calls.append(k) or real(*a, **k))
    out = tmp_path / "run"
    assert main(["train", str(_short_digits_eqm(tmp_path)), "--out", str(out), "--quiet"]) == 0
    assert calls == [{"n_steps": 7, "step_size": 0.01, "momentum": 0.0}]
    quality = json.loads((out / "metrics.json").read_text())["sample_quality"]
    assert torch.load(out / "samples.pt").shape == (50, 1, 8, 8)
    assert {"classifier_ratio", "confident_classes", "spread"} <= set(quality)


@pytest.mark.slow
def test_the_bundled_digits_eqm_run_meets_the_sample_targets(tmp_path):
    """The full `ebm train digits_eqm` (about 2 minutes on 2 cores): classifier ratio at least 0.8, all ten classes
    among the confident samples, spread at least 0.8, and samples that are not copies of training digits."""
    import json

    from ebmcore.cli import main

    out = tmp_path / "digits_eqm"
    assert main(["train", "digits_eqm", "--out", str(out), "--quiet"]) == 0
    quality = json.loads((out / "metrics.json").read_text())["sample_quality"]
    assert quality["classifier_ratio"] >= 0.8 and quality["confident_classes"] == 10 and quality["spread"] >= 0.8
    assert quality["nearest_train_rms_samples"] > 0.5 * quality["nearest_train_rms_test"]
