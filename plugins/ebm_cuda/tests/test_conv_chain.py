"""The convolutional Langevin chain of the host build, ``conv_langevin_chain`` (``ebm_losses.ConvEnergy``'s network run
inside the kernel). Held to the reference path: autograd's gradient of the same ``ConvEnergy`` and the stream's noise
(``ebm_cuda.reference.normal`` for the image flattened in (C, H, W) order), step for step; through the sampler and the
persistent contrastive divergence loss, which take it by default.
"""

import pytest
import torch

from ebmcore.errors import InputError
from ebmcore.kernels.fused import langevin_chain_reference
from ebm_cuda import conv_ops, library, native, reference
from ebm_cuda.conv_ops import _conv_langevin_chain_kernel as conv_langevin_chain
from ebm_losses import ConvEnergy, PersistentContrastiveDivergence
from ebm_samplers import LangevinSampler

ACTIVATIONS = ("relu", "sigmoid", "silu", "tanh")


def _autograd_chain(energy, x, n_steps, h, s, seed, offset=0):
    """The op's reference (``x − h∇E(x) + s·ξ_t``) with autograd's gradient and the stream's normals (per image,
    C-order)."""
    return langevin_chain_reference(
        energy.gradient, x, n_steps=n_steps, step_size=h, noise_scale=s, seed=seed, offset=offset, normal=reference.normal
    )


def _noise_only(x, n_steps, s, seed, offset=0):
    for t in range(n_steps):
        x = x + s * reference.normal(x.shape[0], x[0].numel(), seed, offset + t).view(x.shape)
    return x


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize(
    "shape, widths, n, h",
    [((1, 8, 8), (32, 64), 37, 10.0), ((3, 6, 6), (8, 12, 16), 5, 10.0), ((2, 5, 7), (5,), 16, 1.0)],
    ids=["digits-net", "rgb-three-convs", "one-conv-odd-image"],
)
def test_the_chain_follows_autograd_and_the_stream(activation, shape, widths, n, h):
    energy = ConvEnergy(shape, widths, activation, seed=0)
    x0 = torch.randn(n, *shape, generator=torch.Generator().manual_seed(1))
    plan = energy.program()
    for n_steps, offset in ((1, 0), (4, 7)):
        out = conv_langevin_chain(x0, plan, n_steps=n_steps, step_size=h, noise_scale=0.05, seed=11, offset=offset)
        expected = _autograd_chain(energy, x0, n_steps, h, 0.05, 11, offset)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)  # float32 rounding in a different order
        # the gradient moves the chains by far more than the tolerance: the comparison sees it
        assert (expected - _noise_only(x0, n_steps, 0.05, 11, offset)).abs().max() > 1e-3


def test_per_chain_step_sizes_and_noise_scales():
    energy = ConvEnergy((1, 8, 8), (32, 64), seed=3)
    x0 = torch.randn(20, 1, 8, 8)
    h, s = torch.linspace(1.0, 10.0, 20), torch.linspace(0.01, 0.1, 20)
    out = conv_langevin_chain(x0, energy.program(), n_steps=3, step_size=h, noise_scale=s, seed=3, offset=0)
    torch.testing.assert_close(out, _autograd_chain(energy, x0, 3, h, s, 3), rtol=1e-5, atol=2e-6)


def test_a_nonfinite_chain_stays_apart_and_threads_change_nothing():
    energy = ConvEnergy((1, 8, 8), (32, 64), seed=0)
    x0 = torch.randn(40, 1, 8, 8)
    x0[7, 0, 3, 4] = float("nan")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = conv_langevin_chain(x0, energy.program(), n_steps=3, step_size=10.0, noise_scale=0.01, seed=0, offset=0)
        torch.set_num_threads(2)
        two = conv_langevin_chain(x0, energy.program(), n_steps=3, step_size=10.0, noise_scale=0.01, seed=0, offset=0)
    finally:
        torch.set_num_threads(threads)
    rest = torch.arange(40) != 7
    assert torch.equal(one[rest], two[rest]) and torch.isfinite(one[rest]).all()
    assert torch.isnan(one[7]).any()


def test_langevin_sampler_takes_the_conv_chain_by_default():
    energy = ConvEnergy((1, 8, 8), (32, 64), seed=0)
    x0 = torch.randn(64, 1, 8, 8)
    sampler = LangevinSampler(energy, step_size=10.0, noise_scale=0.005)
    assert sampler.prepare(x0, None, {}).path.startswith("fused chain")
    out = sampler.sample(x0, 4, burn_in=2, generator=torch.Generator().manual_seed(2))
    seed = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(2)))  # the key a fused run draws
    torch.testing.assert_close(out, _autograd_chain(energy, x0, 6, 10.0, 0.005, seed), rtol=1e-5, atol=2e-6)


def test_networks_the_kernel_cannot_run_keep_the_per_step_loop():
    x = torch.randn(4, 1, 8, 8)

    def path(energy, x=x):
        return LangevinSampler(energy, step_size=1.0).prepare(x, None, {}).path

    normalised = path(ConvEnergy(widths=(8, 16), spectral_norm=True, seed=0))
    assert normalised.startswith("per-step loop (spectral_norm re-normalises the weights"), normalised
    assert "conv_langevin_chain kernel has no softplus" in path(ConvEnergy(widths=(8,), activation="softplus", seed=0))
    double = path(ConvEnergy(widths=(8,), seed=0, dtype=torch.float64), x.double())
    assert double.startswith("per-step loop (no kernel for conv_langevin_chain"), double  # float32 only
    hooked = ConvEnergy(widths=(8,), seed=0)
    hooked.features[0].register_forward_hook(lambda module, args, out: out * 2)
    assert path(hooked).startswith("per-step loop (module Conv2d has forward hooks")
    weight_normed = ConvEnergy(widths=(8,), seed=0)
    torch.nn.utils.parametrizations.weight_norm(weight_normed.features[0])
    assert path(weight_normed).startswith("per-step loop (module ParametrizedConv2d is parametrized")
    changed = ConvEnergy(widths=(8,), seed=0)
    changed.features[0].padding = (0, 0)
    assert path(changed).startswith("per-step loop (a layer was changed from 3×3 convolutions (padding 1")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert path(ConvEnergy(widths=(8,), seed=0)).startswith("per-step loop (torch.autocast is on")


def test_the_op_checks_its_arguments():
    x = torch.randn(3, 2, 5, 5)
    w = [torch.randn(4, 2, 3, 3), torch.randn(1, 4)]
    b = [torch.randn(4), torch.randn(1)]
    with pytest.raises(InputError, match=r"x must be \(n, C, H, W\)"):
        conv_ops._conv_langevin_chain(x.flatten(1), w, b, [1], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match=r"weights\[0\] of shape \(4, 3, 3, 3\) does not follow 2 channels"):
        conv_ops._conv_langevin_chain(x, [torch.randn(4, 3, 3, 3), w[1]], b, [1], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="into one output"):
        conv_ops._conv_langevin_chain(x, [w[0], torch.randn(2, 4)], b, [1], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="one stride per convolution"):
        conv_ops._conv_langevin_chain(x, w, b, [], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="float32 states on the CPU only"):
        conv_ops._conv_langevin_chain(x.double(), w, b, [1], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(
        InputError, match=r"conv_langevin_chain: the host build runs it, on CPU tensors only; got tensors on meta"
    ):
        conv_ops._conv_langevin_chain(x, [w[0].to("meta"), w[1]], b, [1], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(library.KernelError, match="unknown activation code"):
        conv_ops._conv_langevin_chain(x, w, b, [1], 9, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    with pytest.raises(library.KernelError, match="strides must be >= 1"):
        conv_ops._conv_langevin_chain(x, w, b, [0], 0, 1.0, 1, 0.1, 0.1, None, None, 0, 0)
    assert torch.equal(conv_ops._conv_langevin_chain(x, w, b, [1], 0, 1.0, 0, 0.1, 0.1, None, None, 0, 0), x)


def test_the_persistent_cd_step_of_the_digits_configuration_runs_the_chain(monkeypatch):
    """One step of ``train_digits.toml`` (PCD, Langevin h = 10, σ = 0.005, energy regularisation) on the conv energy:
    the chains run in the kernel, and the loss and every parameter's gradient are finite."""
    calls = []
    kernel = native._OPS["conv_langevin_chain"]  # the op every call goes through
    monkeypatch.setitem(native._OPS, "conv_langevin_chain", lambda *args: calls.append(args[6]) or kernel(*args))
    energy = ConvEnergy(widths=(32, 64), seed=0)
    loss = PersistentContrastiveDivergence(
        "langevin",
        20,
        sampler_options={"step_size": 10.0, "noise_scale": 0.005},
        buffer_size=200,
        reinit_fraction=0.05,
        regularization=0.1,
    )
    data = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    value.backward()
    assert calls == [20]  # one launch of the 20 steps
    assert torch.isfinite(value) and all(torch.isfinite(p.grad).all() for p in energy.parameters())
    assert torch.isfinite(loss.buffer).all()
