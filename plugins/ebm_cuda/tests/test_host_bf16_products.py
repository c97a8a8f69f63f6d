"""The host feed-forward chain's products (``feedforward_ops.host_products``): IEEE float32 by default and under
``"highest"``/``"high"`` (the CPU has no TF32), bfloat16 operands summed in float32 under ``"medium"`` or
``precision="bf16"``, by float32 FMAs on rounded operands (``BF16_BY = "fma"``) or by vdpbf16ps where the build has
AVX512-BF16.

The bfloat16 chain's gradient is held to float64 autograd's within the error docs/cuda.md states, its law to the
float32 chain's (independent noise, moments within 5 standard errors); the float32 chain is the same code whatever
the switch says.
"""

import pytest
import torch
from torch import nn

import ebmcore
from ebm_cuda import feedforward_ops
from ebm_cuda.feedforward_ops import _langevin_chain_kernel
from ebm_losses import ContrastiveDivergence
from ebm_samplers import LangevinSampler

BF16_GRADIENT_BOUND = 2.0**-7
"""The bfloat16 chain's gradient error, ``max |∇E_bf16 − ∇E_float64|`` over the chains relative to ``max |∇E|``:
measured 0.28–0.39 % (about 2⁻⁸, one bfloat16 rounding of the operands, 2⁻⁹ each, through the two products) on
three W4-shaped networks at 4,096 points; held to 2⁻⁷ (0.78 %)."""

IEEE_GRADIENT_BOUND = 1e-5
"""The float32 chain's, likewise: measured 2e-6 (the float32 rounding of ``x − ∇E`` included)."""


@pytest.fixture(autouse=True)
def _restore_switches():
    setting, by = torch.get_float32_matmul_precision(), feedforward_ops.BF16_BY
    yield
    torch.set_float32_matmul_precision(setting)
    feedforward_ops.BF16_BY = by


def _mlp(seed: int, widths=(64, 64), d: int = 2) -> nn.Sequential:
    torch.manual_seed(seed)
    layers, prev = [], d
    for w in widths:
        layers += [nn.Linear(prev, w), nn.SiLU()]
        prev = w
    return nn.Sequential(*layers, nn.Linear(prev, 1))


def _program(net):
    return ebmcore.SequentialEnergy(net).program()


def _chain(net, x, n_steps, h, s, seed, precision):
    program = _program(net)
    return _langevin_chain_kernel(
        x, program, n_steps=n_steps, step_size=h, noise_scale=s, seed=seed, offset=0, precision=precision
    )


def _dot_built() -> bool:
    return "vdpbf16ps built" in feedforward_ops.bf16_instructions()


def test_the_switch_names_the_host_products():
    torch.set_float32_matmul_precision("highest")
    assert feedforward_ops.host_products(None) == (None, None)
    torch.set_float32_matmul_precision("high")  # TF32: no such CPU product, float32 here
    assert feedforward_ops.host_products(None) == (None, None)
    torch.set_float32_matmul_precision("medium")
    assert feedforward_ops.host_products(None) == ("bf16", None)
    for name, products in (("ieee", None), ("tf32x3", None), ("tf32", None), ("bf16", "bf16")):
        assert feedforward_ops.host_products(name) == (products, None)
    with pytest.raises(ebmcore.errors.InputError, match="precision must be one of"):
        feedforward_ops.host_products("medium")  # torch's words name the switch, precision= takes the products


def test_float32_is_the_same_chain_whatever_the_switch_says():
    """ "highest", "high", None, "ieee", "tf32": the float32 chain, to the bit (and the C code's float32 path is the one
    from before bfloat16 products: only new branches were added, which these do not take)."""
    net = _mlp(0)
    x0 = torch.randn(257, 2, generator=torch.Generator().manual_seed(1))
    runs = []
    for setting in ("highest", "high"):
        torch.set_float32_matmul_precision(setting)
        runs += [_chain(net, x0, 20, 0.01, 0.02**0.5, 5, p) for p in (None, "ieee", "tf32", "tf32x3")]
    runs.append(feedforward_ops.feedforward_langevin_chain(x0, *_layers(net), 20, 0.01, 0.02**0.5, None, None, 5, 0))
    for out in runs[1:]:
        assert torch.equal(out, runs[0])
    torch.set_float32_matmul_precision("medium")
    assert not torch.equal(_chain(net, x0, 20, 0.01, 0.02**0.5, 5, None), runs[0])


def _layers(net):
    from ebm_cuda.network_layers import layers

    return layers(_program(net))


def _gradient_error(net, x, precision):
    """``max |∇E − ∇E_float64| / max |∇E_float64|`` with ∇E from one noiseless step of size 1 (``x − ∇E(x)``)."""
    moved = _chain(net, x, 1, 1.0, 0.0, 0, precision)
    gradient = x.double() - moved.double()
    x64 = x.double().requires_grad_()
    (exact,) = torch.autograd.grad(net.double()(x64).sum(), x64)
    net.float()
    return float((gradient - exact).abs().max() / exact.abs().max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_bf16_gradient_has_the_stated_error(seed):
    net = _mlp(seed)
    x = 2.0 * torch.randn(4096, 2, generator=torch.Generator().manual_seed(seed + 10))
    assert _gradient_error(net, x, "ieee") < IEEE_GRADIENT_BOUND
    bf16 = _gradient_error(net, x, "bf16")
    assert 2.0**-12 < bf16 < BF16_GRADIENT_BOUND  # rounded (not float32), within the bound


@pytest.mark.skipif(not _dot_built(), reason="this build has no vdpbf16ps (a CPU without avx512_bf16)")
@pytest.mark.parametrize("widths, d", [((64, 64), 2), ((48, 33, 40), 3), ((16, 17), 20)])
def test_vdpbf16ps_computes_the_same_products_as_the_fmas(widths, d):
    """The same bfloat16 operands, summed in float32 in another order (pairs first; denormals flushed)."""
    net = _mlp(3, widths, d)
    x = torch.randn(100, d, generator=torch.Generator().manual_seed(4))
    by_fma = _chain(net, x, 5, 0.01, 0.1, 3, "bf16")
    feedforward_ops.BF16_BY = "vdpbf16ps"
    by_dot = _chain(net, x, 5, 0.01, 0.1, 3, "bf16")
    torch.testing.assert_close(by_dot, by_fma, rtol=0, atol=2e-5)
    assert not torch.equal(by_dot, _chain(net, x, 5, 0.01, 0.1, 3, "ieee"))


def test_the_bf16_chain_samples_the_float32_chains_law():
    """8,192 chains × 300 steps of ULA (step 0.01) on a W4-shaped network from N(0, I), the two runs with independent
    noise: each coordinate's mean and second moment agree within 5 standard errors of the difference (the chains are
    independent, so the errors are the sample standard deviations over √8192: about 0.011 for a mean here). The bias
    bfloat16 products add is ~0.4 % of the drift (the gradient error above) over 3 time units: far below them."""
    net = _mlp(7)
    n = 8192
    x0 = torch.randn(n, 2, generator=torch.Generator().manual_seed(8))
    float32 = _chain(net, x0, 300, 0.01, 0.02**0.5, 11, "ieee").double()
    bf16 = _chain(net, x0, 300, 0.01, 0.02**0.5, 12, "bf16").double()
    for f in (lambda x: x, lambda x: x * x):
        a, b = f(float32), f(bf16)
        se = ((a.var(0) + b.var(0)) / n).sqrt()
        z = ((a.mean(0) - b.mean(0)) / se).abs()
        assert (z < 5).all(), z
    same_noise = _chain(net, x0, 300, 0.01, 0.02**0.5, 11, "bf16")
    assert 0 < (same_noise.double() - float32).abs().max() < 0.05  # the same noise: close paths, not equal ones


def test_the_sampler_takes_bf16_products_from_the_switch_or_precision():
    energy = ebmcore.SequentialEnergy(_mlp(0))
    x0 = torch.randn(64, 2, generator=torch.Generator().manual_seed(1))
    torch.set_float32_matmul_precision("medium")
    by_switch = LangevinSampler(energy, step_size=0.01)
    assert by_switch.prepare(x0, None, {}).path.startswith("fused chain (cpu_fused, bf16 products)")
    torch.set_float32_matmul_precision("highest")
    by_name = LangevinSampler(energy, step_size=0.01, precision="bf16")
    assert by_name.prepare(x0, None, {}).path.startswith("fused chain (cpu_fused, bf16 products)")
    plain = LangevinSampler(energy, step_size=0.01, precision="tf32")  # no TF32 on the CPU: float32, named as ever
    assert plain.prepare(x0, None, {}).path.startswith("fused chain") and "products" not in plain.prepare(x0, None, {}).path
    g = lambda: torch.Generator().manual_seed(2)  # noqa: E731
    a, b = by_name.sample(x0, 10, generator=g()), LangevinSampler(energy, step_size=0.01).sample(x0, 10, generator=g())
    assert not torch.equal(a, b) and (a - b).abs().max() < 1e-2
    torch.set_float32_matmul_precision("medium")
    assert torch.equal(by_switch.sample(x0, 10, generator=g()), a)


def test_contrastive_divergence_runs_a_bf16_chain_apart_from_its_float32_loss_kernel():
    """The host's contrastive kernel computes float32 products only: with a bfloat16 chain the loss runs the chain,
    then the energies, rather than handing the chain's products to a kernel that does not take them."""
    energy = ebmcore.SequentialEnergy(_mlp(0))
    data = torch.randn(128, 2, generator=torch.Generator().manual_seed(3))
    loss = ContrastiveDivergence(LangevinSampler(energy, step_size=0.01, precision="bf16"), n_steps=5)
    value = loss(energy, data, generator=torch.Generator().manual_seed(4))
    value.backward()
    assert torch.isfinite(value) and all(p.grad is not None for p in energy.parameters())


def test_ebm_cuda_info_names_the_host_chains_products(capsys):
    import argparse

    from ebm_cuda import cli

    torch.set_float32_matmul_precision("medium")
    cli._info(argparse.Namespace())
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cpu_fused feed-forward chain"))
    assert line.startswith("cpu_fused feed-forward chain: bf16 products ('medium';") and "float32 FMAs" in line
    torch.set_float32_matmul_precision("highest")
    cli._info(argparse.Namespace())
    assert "cpu_fused feed-forward chain: ieee products ('highest';" in capsys.readouterr().out
