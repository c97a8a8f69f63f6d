"""The ``conv`` image energy: registration, shapes, gradients, and every builtin sampler on ``(n, 1, 8, 8)`` states."""

from __future__ import annotations

import pytest
import torch

from ebmcore import registry
from ebmcore.errors import InputError
from ebm_losses import ConvEnergy


def test_conv_is_registered_and_maps_images_to_scalars():
    energy = registry.get("energy", "conv")(image_shape=(3, 8, 8), widths=[8, 16], seed=0)
    assert isinstance(energy, ConvEnergy) and energy.event_shape == (3, 8, 8)
    assert energy.energy(torch.randn(5, 3, 8, 8)).shape == (5,)
    with pytest.raises(InputError, match=r"x must have shape \(n, 3, 8, 8\) for ConvEnergy"):
        energy.energy(torch.randn(5, 1, 8, 8))


def test_seeded_initialisation_is_reproducible_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a = ConvEnergy(seed=3, spectral_norm=True)
    b = ConvEnergy(seed=3, spectral_norm=True)
    assert torch.equal(torch.get_rng_state(), state)
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(a.energy(x), b.energy(x), rtol=0, atol=0)
    assert not torch.equal(ConvEnergy(seed=4).energy(x), ConvEnergy(seed=3).energy(x))


@pytest.mark.parametrize("spectral_norm", [False, True])
def test_gradient_matches_central_differences_in_float64(spectral_norm):
    energy = ConvEnergy(widths=(4, 6), seed=1, spectral_norm=spectral_norm, dtype=torch.float64).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grad = energy.gradient(x)
    eps = 1e-6
    for index in [(0, 0, 0, 0), (0, 0, 3, 5), (1, 0, 7, 7), (1, 0, 4, 2)]:
        up, down = x.clone(), x.clone()
        up[index] += eps
        down[index] -= eps
        with torch.no_grad():
            numeric = (energy.energy(up) - energy.energy(down))[index[0]] / (2 * eps)
        assert float(grad[index]) == pytest.approx(float(numeric), rel=1e-6, abs=1e-9)


def test_bad_arguments_name_the_fix():
    with pytest.raises(InputError, match=r"image_shape must be \(C, H, W\)"):
        ConvEnergy(image_shape=(8, 8))
    with pytest.raises(InputError, match="unknown activation 'swoosh'"):
        ConvEnergy(activation="swoosh")
    with pytest.raises(InputError, match="widths must be positive integers"):
        ConvEnergy(widths=[8, 0])


@pytest.mark.parametrize(
    "name, options",
    [
        ("langevin", {"step_size": 1e-3}),
        ("mala", {"step_size": 1e-2}),
        ("hmc", {"step_size": 0.05, "n_leapfrog_steps": 3}),
        ("nuts", {"step_size": 0.05, "max_tree_depth": 3}),
    ],
)
def test_every_builtin_sampler_runs_on_image_states_with_a_clean_fallback(name, options):
    """Image states ``(n, 1, 8, 8)``: samples keep the shape and stay finite; the fused-kernel choice falls back to the
    per-step loop with a reason (no analytic kernel for a neural energy), and the gradient path says autograd."""
    energy = ConvEnergy(widths=(4, 8), seed=0, spectral_norm=True)
    sampler = registry.get("sampler", name)(energy, **options)
    x0 = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    path = sampler.prepare(x0, None, {}).path
    assert path.startswith("per-step loop (") and "autograd" in path
    samples = sampler.sample(x0, 5, generator=torch.Generator().manual_seed(1))
    assert samples.shape == (6, 1, 8, 8) and bool(torch.isfinite(samples).all())
    assert not torch.equal(samples, x0)


@pytest.mark.parametrize(
    "name, options",
    [
        ("contrastive_divergence", {"n_steps": 2}),
        ("persistent_contrastive_divergence", {"n_steps": 2, "buffer_size": 16}),
        ("score_matching", {}),
        ("sliced_score_matching", {}),
        ("denoising_score_matching", {"sigma": 0.1}),
        ("nce", {}),
    ],
)
def test_every_registered_loss_trains_the_conv_energy_on_images(name, options):
    """Every loss takes image batches ``(n, 1, 8, 8)``: a finite scalar whose gradient reaches every weight matrix."""
    energy = ConvEnergy(widths=(4, 8), seed=0)
    loss = registry.get("loss", name)(**options)
    data = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    value.backward()
    assert value.shape == () and bool(torch.isfinite(value))
    weights = [p for n, p in energy.named_parameters() if n.endswith("weight")]  # the last bias shifts E, not ∇ₓE
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in weights)


def test_conv_meets_the_energy_contract():
    """``ebmcore.testing.check_energy``: shapes, dtype and device kept, gradient equal to autograd and to finite
    differences (float64), on image inputs."""
    from ebmcore.testing import check_energy

    energy = ConvEnergy(widths=(4, 6), seed=2, dtype=torch.float64)
    check_energy(energy, torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
