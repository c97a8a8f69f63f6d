"""The feed-forward kernels of the host build: ``feedforward_langevin_chain`` (Langevin chains of a network run inside
the kernel), ``feedforward_denoising_score_matching`` and ``feedforward_sliced_score_matching`` (the losses with their
weight gradients in one pass), ``feedforward_energy_gradients`` and ``feedforward_contrastive_chain`` (contrastive
divergence's energies and weight gradient, the latter with its chains).

Held to the reference path: autograd's gradient of the same network and the stream's noise
(``ebm_cuda.reference.normal``), step for step; through the sampler, to a known law; the loss and its gradients
to autograd's in float64 (nested for the Hessian), and through the loss classes to the torch path of the same loss.
"""

import warnings

import pytest
import torch
from torch import nn

import ebmcore
from ebmcore.energies import feedforward
from ebmcore.energies.base import closed_form_program
from ebmcore.kernels.fused import langevin_chain_reference
from ebmcore.errors import InputError
from ebm_cuda import contrastive_op, feedforward_ops, library, reference
from ebm_cuda.activations import activation_code
from ebmcore.energies.program import activation_of
from ebm_cuda.feedforward_ops import _langevin_chain_kernel as feedforward_langevin_chain
from ebm_losses import ContrastiveDivergence, DenoisingScoreMatching, SlicedScoreMatching
from ebm_losses.ops import LOSS_OPS
from ebm_samplers import LangevinSampler

ACTIVATIONS = {"silu": nn.SiLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU}
PARAMETRISED = {"leaky_relu": lambda: nn.LeakyReLU(0.2), "elu": lambda: nn.ELU(0.7)}
"""Activations whose codes carry a parameter (not the default's: the kernels must read it)."""
EVERY = sorted(ACTIVATIONS) + sorted(PARAMETRISED)


def Net(net: nn.Module, sign: float = 1.0) -> ebmcore.SequentialEnergy:
    return ebmcore.SequentialEnergy(net, negate=sign < 0)


def _network(d, widths, activation, *, bias=True, seed=0):
    torch.manual_seed(seed)
    layers, prev = [], d
    for w in widths:
        layers += [nn.Linear(prev, w, bias=bias), {**ACTIVATIONS, **PARAMETRISED}[activation]()]
        prev = w
    return nn.Sequential(*layers, nn.Linear(prev, 1, bias=bias))


def _graph_has(node, name: str) -> bool:
    """Whether the autograd graph from ``node`` has a node whose type name contains ``name``."""
    return node is not None and (name in type(node).__name__ or any(_graph_has(n, name) for n, _ in node.next_functions))


def _assert_layer_gradients(linears, grad_w, grad_b, *, output_bias: bool):
    """The kernel's float32 gradients against autograd's float64 ``.grad`` of every layer, relative to each layer's largest
    weight gradient; ``output_bias``: whether the output bias has a gradient (not where the loss depends on ∇E only)."""
    for m, gw, gb in zip(linears, grad_w, grad_b):
        scale = m.weight.grad.abs().max() + 1e-12
        torch.testing.assert_close(gw.double() / scale, m.weight.grad / scale, rtol=0, atol=5e-5)
        if m.bias is None or (m is linears[-1] and not output_bias):
            assert gb is None and (m.bias is None or m.bias.grad is None)
        else:
            torch.testing.assert_close(gb.double() / scale, m.bias.grad / scale, rtol=0, atol=5e-5)


def _linears_and_codes(net, activation, widths):
    linears = [m for m in net if isinstance(m, nn.Linear)]
    return (
        linears,
        [m.weight.float() for m in linears],
        [None if m.bias is None else m.bias.float() for m in linears],
        [activation_code(activation_of(m)) for m in net if activation_of(m) is not None],
    )


def _autograd_chain(energy, x, n_steps, h, s, seed, offset=0):
    """The op's reference (``x − h∇E(x) + s·ξ_t``) with autograd's gradient and the stream's normals."""
    return langevin_chain_reference(
        energy.gradient, x, n_steps=n_steps, step_size=h, noise_scale=s, seed=seed, offset=offset, normal=reference.normal
    )


@pytest.mark.parametrize("activation", EVERY)
@pytest.mark.parametrize(
    "d, widths, n, bias, sign",
    [(2, [64, 64], 100, True, 1.0), (3, [20, 33], 37, True, -1.0), (17, [5], 16, False, 1.0), (1, [40, 7, 24], 1, True, 1.0)],
    ids=["w4-shape", "odd-widths-negated", "wide-input-no-bias", "three-hidden-one-chain"],
)
def test_the_chain_follows_autograd_and_the_stream(activation, d, widths, n, bias, sign):
    energy = Net(_network(d, widths, activation, bias=bias), sign)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    network, why = closed_form_program(energy, x0)
    assert network is not None, why
    out = feedforward_langevin_chain(x0, network, n_steps=6, step_size=0.02, noise_scale=0.2, seed=11, offset=5)
    expected = _autograd_chain(energy, x0, 6, 0.02, 0.2, 11, 5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)  # float32 rounding in a different order


def test_per_chain_step_sizes_and_noise_scales():
    energy = Net(_network(2, [32, 32], "silu"))
    x0 = torch.randn(40, 2)
    network, _ = closed_form_program(energy, x0)
    h, s = torch.linspace(0.01, 0.05, 40), torch.linspace(0.1, 0.3, 40)
    out = feedforward_langevin_chain(x0, network, n_steps=3, step_size=h, noise_scale=s, seed=3, offset=0)
    torch.testing.assert_close(out, _autograd_chain(energy, x0, 3, h, s, 3), rtol=1e-5, atol=2e-6)


def test_a_nonfinite_chain_stays_apart_and_threads_change_nothing():
    energy = Net(_network(2, [64, 64], "silu"))
    x0 = torch.randn(50, 2)
    x0[7, 1] = float("nan")
    network, _ = closed_form_program(energy, x0[:4])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = feedforward_langevin_chain(x0, network, n_steps=5, step_size=0.01, noise_scale=0.1, seed=0, offset=0)
        torch.set_num_threads(2)
        two = feedforward_langevin_chain(x0, network, n_steps=5, step_size=0.01, noise_scale=0.1, seed=0, offset=0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[torch.arange(50) != 7], two[torch.arange(50) != 7])
    assert torch.isnan(one[7]).all() and torch.isfinite(one[torch.arange(50) != 7]).all()


def test_langevin_sampler_takes_the_network_chain_by_default():
    energy = Net(_network(2, [64, 64], "silu"))
    x0 = torch.randn(64, 2)
    sampler = LangevinSampler(energy, step_size=0.01)
    path = sampler.prepare(x0, None, {}).path
    assert path.startswith("fused chain") and "feed-forward network 2-64-64-1" in path
    out = sampler.sample(x0, 4, burn_in=2, generator=torch.Generator().manual_seed(2))
    seed = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(2)))  # the key a fused run draws
    torch.testing.assert_close(out, _autograd_chain(energy, x0, 6, 0.01, 0.02**0.5, seed), rtol=1e-5, atol=2e-6)


def test_the_network_chain_samples_a_known_law():
    """A ReLU network whose energy is ``|x₁| + |x₂|``: the density is Laplace(0, 1) per coordinate (mean 0, variance 2,
    E x⁴ = 24). 4,000 chains, 500 steps of h = 0.01 from N(0, I): each coordinate's mean is within 5 standard errors
    (√(2/4000) = 0.022) of 0 and its variance within 5 standard errors (√(20/4000) = 0.071) of 2, on both paths."""
    net = nn.Sequential(nn.Linear(2, 4, bias=False), nn.ReLU(), nn.Linear(4, 1, bias=False))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]))
        net[2].weight.fill_(1.0)
    energy = Net(net)
    x0 = torch.randn(4000, 2, generator=torch.Generator().manual_seed(0))
    assert LangevinSampler(energy, step_size=0.01).prepare(x0, None, {}).chain is not None
    for fused in (None, False):
        x = LangevinSampler(energy, step_size=0.01, fused=fused).sample(x0, 500, generator=torch.Generator().manual_seed(1))
        assert (x.mean(0).abs() < 5 * (2 / 4000) ** 0.5).all(), (fused, x.mean(0))
        assert ((x.var(0) - 2).abs() < 5 * (20 / 4000) ** 0.5).all(), (fused, x.var(0))


def test_networks_the_kernel_cannot_run_keep_the_per_step_loop():
    gelu = Net(nn.Sequential(nn.Linear(2, 8), nn.GELU(), nn.Linear(8, 1)))
    path = LangevinSampler(gelu, step_size=0.01).prepare(torch.randn(4, 2), None, {}).path
    assert "feedforward_langevin_chain kernel has no gelu (it takes" in path and path.startswith("per-step loop")
    double = Net(_network(2, [8], "silu").double())
    path = LangevinSampler(double, step_size=0.01).prepare(torch.randn(4, 2, dtype=torch.float64), None, {}).path
    assert path.startswith("per-step loop (no kernel for feedforward_langevin_chain")  # float32 only


def test_the_op_checks_its_arguments():
    x = torch.randn(8, 3)
    w = [torch.randn(4, 3), torch.randn(1, 4)]
    b = [None, None]
    with pytest.raises(InputError, match=r"weights\[0\] of shape \(4, 2\) does not follow width 3"):
        feedforward_ops._feedforward_langevin_chain(x, [torch.randn(4, 2), w[1]], b, [0], 1.0, 1, 0.01, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="into one output"):
        feedforward_ops._feedforward_langevin_chain(x, [w[0], torch.randn(2, 4)], b, [0], 1.0, 1, 0.01, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="one activation per hidden layer"):
        feedforward_ops._feedforward_langevin_chain(x, w, b, [], 1.0, 1, 0.01, 0.1, None, None, 0, 0)
    with pytest.raises(InputError, match="float32 states on the CPU only"):
        feedforward_ops._feedforward_langevin_chain(x.double(), w, b, [0], 1.0, 1, 0.01, 0.1, None, None, 0, 0)
    with pytest.raises(library.KernelError, match="unknown activation code"):
        feedforward_ops._feedforward_langevin_chain(x, w, b, [9], 1.0, 1, 0.01, 0.1, None, None, 0, 0)
    assert torch.equal(feedforward_ops._feedforward_langevin_chain(x, w, b, [0], 1.0, 0, 0.01, 0.1, None, None, 0, 0), x)


def test_a_network_off_the_cpu_is_refused_by_the_host_only_ops_with_the_fix():
    """The network ops have no CUDA build: their implementation, what ``torch.ops.ebm_cuda.<op>`` runs for CPU and CUDA
    tensors (CPU states with a CUDA weight dispatch to it), hands every pointer to the host build, which reads them
    from the CPU. A weight or bias on another device is refused by name, with the fix, before the host build sees
    it: here ``meta`` tensors (no memory at all) stand in for CUDA ones, which this machine may not have."""
    x, ones = torch.randn(5, 3), torch.ones(5)
    w, b = [torch.randn(4, 3), torch.randn(1, 4)], [torch.randn(4), torch.randn(1)]
    runs = {
        "feedforward_langevin_chain": lambda w, b: feedforward_ops._feedforward_langevin_chain(
            x, w, b, [0], 1.0, 2, 0.01, 0.1, None, None, 0, 0
        ),
        "feedforward_energy_gradients": lambda w, b: feedforward_ops._feedforward_energy_gradients_host(
            x, ones, None, w, b, [0], 1.0
        ),
        "feedforward_contrastive_chain": lambda w, b: contrastive_op._feedforward_contrastive_chain_host(
            x, (ones, None), (ones, None), w, b, [0], 1.0, 2, 0.01, 0.1, None, None, 0, 0
        ),
        "feedforward_denoising_score_matching": lambda w, b: feedforward_ops._feedforward_denoising_score_matching_host(
            x, x, None, w, b, [0], 1.0
        ),
        "feedforward_sliced_score_matching": lambda w, b: feedforward_ops._feedforward_sliced_score_matching_host(
            x, x, w, b, [0], 1.0
        ),
    }
    for name, run in runs.items():
        run(w, b)  # all on the CPU: it runs
        for weights, biases in (([w[0].to("meta"), w[1]], b), (w, [b[0], b[1].to("meta")])):
            with pytest.raises(
                InputError,
                match=rf"^ebm_cuda\.{name}: the host build runs it, on CPU tensors only; got "
                r"tensors on meta\. Move the tensors .* to the CPU, or on a GPU select",
            ):
                run(weights, biases)


@pytest.mark.parametrize("activation", EVERY)
@pytest.mark.parametrize(
    "d, widths, n, bias, sign, scaled",
    [
        (2, [64, 64], 300, True, 1.0, False),
        (3, [20, 33], 37, True, -1.0, True),
        (17, [5], 16, False, 1.0, False),
        (1, [40, 7, 24], 5, True, 1.0, True),
    ],
    ids=["w7-shape", "odd-widths-negated-scaled", "wide-input-no-bias", "three-hidden-scaled"],
)
def test_the_denoising_loss_and_its_gradients_equal_autograds(activation, d, widths, n, bias, sign, scaled):
    """``(1/2n) Σ |a∇E(x) − b|²`` and its weight and bias gradients against nested autograd in float64."""
    net = _network(d, widths, activation, bias=bias).double()
    g = torch.Generator().manual_seed(2)
    x, b = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    a = torch.rand(n, generator=g, dtype=torch.float64) + 0.5 if scaled else None
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(sign * net(xg).sum(), xg, create_graph=True)
    residual = (a[:, None] * grad if scaled else grad) - b
    expected = 0.5 * (residual * residual).sum(1).mean()
    expected.backward()
    linears, weights, biases, codes = _linears_and_codes(net, activation, widths)
    value, grad_w, grad_b = feedforward_ops.feedforward_denoising_score_matching(
        x.float(), b.float(), None if a is None else a.float(), weights, biases, codes, sign
    )
    torch.testing.assert_close(value.double(), expected.detach(), rtol=2e-6, atol=1e-7)
    _assert_layer_gradients(linears, grad_w, grad_b, output_bias=False)


def test_the_denoising_kernel_checks_its_arguments():
    x = torch.randn(8, 3)
    w, b = [torch.randn(4, 3), torch.randn(1, 4)], [torch.randn(4), None]
    with pytest.raises(InputError, match=r"biases\[0\] of shape \(5,\) does not fit"):
        feedforward_ops.feedforward_denoising_score_matching(x, x, None, w, [torch.randn(5), None], [0], 1.0)
    with pytest.raises(InputError, match="target must have the shape of x"):
        feedforward_ops.feedforward_denoising_score_matching(x, x[:, :2], None, w, b, [0], 1.0)
    with pytest.raises(InputError, match=r"scale must have shape \(n_chains,\)"):
        feedforward_ops.feedforward_denoising_score_matching(x, x, torch.ones(3), w, b, [0], 1.0)


@pytest.mark.parametrize("activation", EVERY)
@pytest.mark.parametrize(
    "d, widths, n, bias, sign",
    [(2, [64, 64], 300, True, 1.0), (3, [20, 33], 37, True, -1.0), (17, [5], 16, False, 1.0), (1, [40, 7, 24], 5, True, 1.0)],
    ids=["w6-shape", "odd-widths-negated", "wide-input-no-bias", "three-hidden"],
)
def test_the_sliced_loss_and_its_gradients_equal_autograds(activation, d, widths, n, bias, sign):
    """``(1/n) Σ ½(vᵀ∇E)² − vᵀ∇²E v`` and its weight and bias gradients against three levels of autograd in float64
    (the third derivatives of every activation enter)."""
    net = _network(d, widths, activation, bias=bias).double()
    g = torch.Generator().manual_seed(3)
    x, v = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(sign * net(xg).sum(), xg, create_graph=True)
    gv = (grad * v).sum(1)
    (hv,) = torch.autograd.grad(gv.sum(), xg, create_graph=True)
    expected = (0.5 * gv * gv - (hv * v).sum(1)).mean()
    expected.backward()
    linears, weights, biases, codes = _linears_and_codes(net, activation, widths)
    value, grad_w, grad_b = feedforward_ops.feedforward_sliced_score_matching(x.float(), v.float(), weights, biases, codes, sign)
    torch.testing.assert_close(value.double(), expected.detach(), rtol=1e-5, atol=1e-6)
    _assert_layer_gradients(linears, grad_w, grad_b, output_bias=False)


def test_variance_reduced_sliced_score_matching_keeps_the_torch_path():
    energy = Net(_network(2, [8], "silu"))
    value = SlicedScoreMatching(variance_reduction=True)(energy, torch.randn(16, 2), generator=torch.Generator().manual_seed(0))
    assert "_GivenGradients" not in type(value.grad_fn).__name__


@pytest.mark.parametrize("activation", EVERY)
@pytest.mark.parametrize(
    "d, widths, n, bias, sign, quadratic",
    [
        (2, [64, 64], 300, True, 1.0, False),
        (3, [20, 33], 37, True, -1.0, True),
        (17, [5], 16, False, 1.0, True),
        (1, [40, 7, 24], 5, True, 1.0, False),
    ],
    ids=["w5-shape", "odd-widths-negated-quadratic", "wide-input-no-bias-quadratic", "three-hidden"],
)
def test_the_energies_and_their_weighted_gradient_equal_autograds(activation, d, widths, n, bias, sign, quadratic):
    """``E(x)`` and ``Σ (aᵣ + bᵣEᵣ) ∂Eᵣ/∂θ`` (the gradient of ``Σ aᵣEᵣ + ½bᵣEᵣ²``) against autograd in float64, every
    weight and bias (the output bias included)."""
    net = _network(d, widths, activation, bias=bias).double()
    g = torch.Generator().manual_seed(4)
    x, a = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    b = torch.rand(n, generator=g, dtype=torch.float64) if quadratic else None
    energies = sign * net(x).squeeze(-1)
    (a * energies + (0.5 * b * energies**2 if quadratic else 0)).sum().backward()
    linears, weights, biases, codes = _linears_and_codes(net, activation, widths)
    got, grad_w, grad_b = feedforward_ops.feedforward_energy_gradients(
        x.float(), a.float(), None if b is None else b.float(), weights, biases, codes, sign
    )
    torch.testing.assert_close(got.double(), energies.detach(), rtol=1e-5, atol=1e-6)
    _assert_layer_gradients(linears, grad_w, grad_b, output_bias=True)


@pytest.mark.parametrize("activation", EVERY)
@pytest.mark.parametrize(
    "d, widths, n, bias, sign, quadratic, per_chain",
    [
        (2, [64, 64], 300, True, 1.0, False, False),
        (3, [20, 33], 37, True, -1.0, True, True),
        (17, [5], 16, False, 1.0, True, False),
        (1, [40, 7, 24], 5, True, 1.0, False, True),
    ],
    ids=["w5-shape", "odd-widths-negated-quadratic-per-chain", "wide-input-no-bias-quadratic-one-step", "three-hidden-per-chain"],
)
def test_the_contrastive_chain_moves_as_the_chain_and_its_gradient_equals_autograds(
    activation, d, widths, n, bias, sign, quadratic, per_chain
):
    """``feedforward_contrastive_chain``: the states of ``feedforward_langevin_chain`` to the bit (its first move reuses
    the starts' pass), the energies at both ends, the loss ``Σ aE + ½bE²`` and its gradient ``Σ c ∂E/∂θ`` over both
    ends (``c = a + bE`` at each) against autograd in float64, every weight and bias."""
    net = _network(d, widths, activation, bias=bias)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(n, d, generator=g)
    a0, a1 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    b0, b1 = (torch.rand(n, generator=g), torch.rand(n, generator=g)) if quadratic else (None, None)
    h, s = (0.01 + 0.02 * torch.rand(n, generator=g), 0.1 + torch.rand(n, generator=g)) if per_chain else (0.01, 0.1)
    hv, sv = (h, s) if per_chain else (None, None)
    h0, s0 = (0.0, 0.0) if per_chain else (h, s)
    linears, weights, biases, codes = _linears_and_codes(net, activation, widths)
    steps = 1 if len(widths) == 1 else 4  # one step: the only move is the one that reuses the starts' pass
    out, e0, e1, loss, grad_w, grad_b = contrastive_op.feedforward_contrastive_chain(
        x, (a0, b0), (a1, b1), weights, biases, codes, sign, steps, h0, s0, hv, sv, 11, 3
    )
    assert torch.equal(
        out, feedforward_ops._feedforward_langevin_chain(x, weights, biases, codes, sign, steps, h0, s0, hv, sv, 11, 3)
    )
    net64 = _network(d, widths, activation, bias=bias).double()
    net64.load_state_dict(net.state_dict())
    linears64 = [m for m in net64 if isinstance(m, nn.Linear)]
    total = 0.0
    for ends, (a, b), got in ((x, (a0, b0), e0), (out, (a1, b1), e1)):
        energies = sign * net64(ends.double()).squeeze(-1)
        torch.testing.assert_close(got.double(), energies.detach(), rtol=1e-5, atol=1e-6)
        total = total + (a.double() * energies + (0.5 * b.double() * energies**2 if quadratic else 0)).sum()
    assert loss.dtype == torch.float32 and loss.shape == ()
    torch.testing.assert_close(loss.double(), total.detach(), rtol=1e-5, atol=1e-5)
    total.backward()
    _assert_layer_gradients(linears64, grad_w, grad_b, output_bias=True)


def test_the_contrastive_chain_checks_its_arguments():
    x = torch.randn(8, 3)
    w, b = [torch.randn(4, 3), torch.randn(1, 4)], [None, None]
    ones = torch.ones(8)
    with pytest.raises(InputError, match="n_steps must be >= 1"):
        contrastive_op.feedforward_contrastive_chain(
            x, (ones, None), (ones, None), w, b, [0], 1.0, 0, 0.01, 0.1, None, None, 0, 0
        )
    with pytest.raises(InputError, match=r"end\[1\] must have shape \(n_chains,\) = \(8,\)"):
        contrastive_op.feedforward_contrastive_chain(
            x, (ones, None), (ones, torch.ones(7)), w, b, [0], 1.0, 2, 0.01, 0.1, None, None, 0, 0
        )
    with pytest.raises(InputError, match="float32 states on the CPU only"):
        contrastive_op.feedforward_contrastive_chain(
            x.double(), (ones, None), (ones, None), w, b, [0], 1.0, 2, 0.01, 0.1, None, None, 0, 0
        )
    with pytest.raises(InputError, match="seed and offset"):
        contrastive_op.feedforward_contrastive_chain(
            x, (ones, None), (ones, None), w, b, [0], 1.0, 2, 0.01, 0.1, None, None, -1, 0
        )


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_a_nan_row_gives_a_nan_energy_and_loss_as_in_torch(activation):
    """A NaN input must not come out finite (torch's activations keep a NaN; a finite energy with NaN weight
    gradients would slip past a training loop's check of the loss)."""
    net = _network(2, [64, 64], activation)
    x = torch.randn(40, 2, generator=torch.Generator().manual_seed(5))
    x[9, 0] = float("nan")
    _, weights, biases, codes = _linears_and_codes(net, activation, [64, 64])
    energies, _, _ = feedforward_ops.feedforward_energy_gradients(x, torch.ones(40), None, weights, biases, codes, 1.0)
    assert torch.isnan(energies[9]) and torch.isfinite(energies[torch.arange(40) != 9]).all()
    # the score-matching losses see x through ∇E only, which under ReLU depends on x through its mask alone (a
    # NaN falls on the zero side, in torch's threshold_backward too): NaN for the smooth activations only
    loss, _, _ = feedforward_ops.feedforward_denoising_score_matching(x, torch.zeros(40, 2), None, weights, biases, codes, 1.0)
    assert bool(torch.isnan(loss)) == (activation != "relu")
    loss, _, _ = feedforward_ops.feedforward_sliced_score_matching(x, torch.ones(40, 2), weights, biases, codes, 1.0)
    assert bool(torch.isnan(loss)) == (activation != "relu")
    c = (torch.full((40,), 0.025), None)
    out, e0, e1, loss, grad_w, _ = contrastive_op.feedforward_contrastive_chain(
        x, c, c, weights, biases, codes, 1.0, 2, 0.01, 0.1, None, None, 0, 0
    )
    assert torch.isnan(e0[9]) and torch.isnan(loss) and torch.isnan(grad_w[-1]).any()  # NaN, never a finite loss
    assert torch.isfinite(out[torch.arange(40) != 9]).all() and torch.isfinite(e1[torch.arange(40) != 9]).all()


LOSSES = {  # name: a fresh loss (CD's negatives by the per-step loop, fused=False: the same on both paths)
    "dsm-one-level": lambda: DenoisingScoreMatching(0.1),
    "dsm-several-levels": lambda: DenoisingScoreMatching(sigmas=[0.05, 0.2, 0.5]),
    "ssm-gaussian": lambda: SlicedScoreMatching(projection="gaussian"),
    "ssm-three-rademacher": lambda: SlicedScoreMatching(3, projection="rademacher"),
    "cd-regularised": lambda: ebmcore.registry.get("loss", "contrastive_divergence")(
        n_steps=5, sampler_options={"step_size": 0.01, "fused": False}, regularization=0.1
    ),
    "pcd": lambda: ebmcore.registry.get("loss", "persistent_contrastive_divergence")(
        n_steps=5, sampler_options={"step_size": 0.01, "fused": False}, buffer_size=64
    ),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_each_loss_takes_its_kernel_and_matches_the_torch_path(name):
    """The value, and the gradients of 2·value (the incoming gradient scales the kernel's), on both paths."""
    energy = Net(_network(2, [64, 64], "silu"))
    data = torch.randn(200, 2, generator=torch.Generator().manual_seed(5))
    results = {}
    for backends in (("cpu_fused", "torch"), ("torch",)):
        loss = LOSSES[name]()
        with ebmcore.use_backend(*backends):
            value = loss(energy, data, generator=torch.Generator().manual_seed(1))
            assert _graph_has(value.grad_fn, "_GivenGradients") == (backends[0] == "cpu_fused")  # which path ran
            energy.zero_grad(set_to_none=True)
            (2.0 * value).backward()
            results[backends[0]] = (value.detach(), [p.grad for p in energy.parameters()])
    assert results["cpu_fused"][0].dtype == torch.float32
    torch.testing.assert_close(results["cpu_fused"][0], results["torch"][0], rtol=1e-5, atol=1e-6)
    assert [g is None for g in results["cpu_fused"][1]] == [
        g is None for g in results["torch"][1]
    ]  # score matching: no output-bias gradient
    for fused, reference_grad in zip(results["cpu_fused"][1], results["torch"][1]):
        if reference_grad is not None:
            torch.testing.assert_close(fused, reference_grad, rtol=1e-4, atol=1e-5 * reference_grad.abs().max().item())


@pytest.mark.parametrize("regularization", [0.0, 0.1], ids=["plain", "regularised"])
def test_contrastive_divergence_takes_its_gradient_from_the_chain_that_draws_its_negatives(regularization, monkeypatch):
    """With the fused chain (the default), CD's negatives and weight gradient come from one
    ``feedforward_contrastive_chain`` call: the negatives are the sampler's own (``advance``, to the bit), and the loss
    and its gradient are the formula's on them, by autograd in float64."""
    calls = []
    real = contrastive_op.feedforward_contrastive_chain
    monkeypatch.setattr(contrastive_op, "feedforward_contrastive_chain", lambda *args: calls.append(1) or real(*args))
    energy = Net(_network(2, [64, 64], "silu"))
    data = torch.randn(200, 2, generator=torch.Generator().manual_seed(5))
    loss = ebmcore.registry.get("loss", "contrastive_divergence")(
        n_steps=5, sampler_options={"step_size": 0.01}, regularization=regularization
    )
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    assert calls == [1] and _graph_has(value.grad_fn, "_GivenGradients")
    assert torch.equal(loss.last_negatives, loss.sampler_for(energy).advance(data, 5, generator=torch.Generator().manual_seed(1)))
    energy64 = Net(_network(2, [64, 64], "silu")).double()
    energy64.load_state_dict(energy.state_dict())
    e_pos, e_neg = energy64.compute_energy(data.double()), energy64.compute_energy(loss.last_negatives.double())
    expected = e_pos.mean() - e_neg.mean() + regularization * (e_pos.square().mean() + e_neg.square().mean())
    torch.testing.assert_close(value.double(), expected.detach(), rtol=1e-5, atol=1e-6)
    (2.0 * value).backward()
    (2.0 * expected).backward()
    for got, reference_param in zip(energy.parameters(), energy64.parameters()):
        ref = reference_param.grad
        torch.testing.assert_close(got.grad.double(), ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


def test_contrastive_divergence_takes_the_contrastive_op_only_from_the_backend_whose_chain_its_sampler_runs(monkeypatch):
    """A backend that outranks the host build for the chain alone (here: the host chain, its noise scaled, so that its
    negatives differ): CD must not take the host build's contrastive op (other negatives than ``advance``'s), and
    falls back to its sampler's chain and autograd; where the same backend has both, it takes them."""
    from ebmcore import KernelBackend, hookimpl
    from ebmcore.testing import isolated_plugins
    from ebm_cuda.backends import HostBackend

    host = HostBackend().kernels

    def other_chain(x, network, *, n_steps, step_size, noise_scale, seed, offset):
        return host["feedforward_langevin_chain"].fn(
            x, network, n_steps=n_steps, step_size=step_size, noise_scale=0.5 * noise_scale, seed=seed, offset=offset
        )

    class Chain:
        @hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                KernelBackend(
                    "chain_only",
                    [ebmcore.Kernel("feedforward_langevin_chain", other_chain, ("cpu",), (torch.float32,), None, 20)],
                )
            )

    calls = []
    real = contrastive_op.feedforward_contrastive_chain
    monkeypatch.setattr(contrastive_op, "feedforward_contrastive_chain", lambda *args: calls.append(1) or real(*args))
    energy = Net(_network(2, [16, 16], "silu"))
    data = torch.randn(40, 2, generator=torch.Generator().manual_seed(5))
    with isolated_plugins(("chain_only", Chain()), autoload=True):
        loss = ebmcore.registry.get("loss", "contrastive_divergence")(n_steps=3, sampler_options={"step_size": 0.01})
        loss(energy, data, generator=torch.Generator().manual_seed(1))
        assert loss.sampler_for(energy).prepare(data, None, {}).chain.backend == "chain_only" and calls == []
        advanced = loss.sampler_for(energy).advance(data, 3, generator=torch.Generator().manual_seed(1))
        assert torch.equal(loss.last_negatives, advanced)
    loss = ebmcore.registry.get("loss", "contrastive_divergence")(n_steps=3, sampler_options={"step_size": 0.01})
    loss(energy, data, generator=torch.Generator().manual_seed(1))
    assert loss.sampler_for(energy).prepare(data, None, {}).chain.backend == "cpu_fused"
    assert calls == [1]  # the host build's chain and its contrastive op, together


def test_a_gradient_penalty_through_the_chains_loss_equals_autograds():
    """``create_graph=True`` through CD's fused path: the loss is recomputed by the torch path on the same negatives,
    so ``L + Σ|∂L/∂θ|²`` differentiates as the formula does in float64."""
    energy = Net(_network(2, [16, 16], "silu"))
    data = torch.randn(64, 2, generator=torch.Generator().manual_seed(6))
    loss = ebmcore.registry.get("loss", "contrastive_divergence")(
        n_steps=3, sampler_options={"step_size": 0.01}, regularization=0.1
    )
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    assert _graph_has(value.grad_fn, "_GivenGradients")
    params = list(energy.parameters())
    grads = torch.autograd.grad(value, params, create_graph=True)
    (value + sum((g * g).sum() for g in grads)).backward()
    energy64 = Net(_network(2, [16, 16], "silu")).double()
    energy64.load_state_dict(energy.state_dict())
    e_pos, e_neg = energy64.compute_energy(data.double()), energy64.compute_energy(loss.last_negatives.double())
    expected = e_pos.mean() - e_neg.mean() + 0.1 * (e_pos.square().mean() + e_neg.square().mean())
    params64 = list(energy64.parameters())
    grads64 = torch.autograd.grad(expected, params64, create_graph=True)
    (expected + sum((g * g).sum() for g in grads64)).backward()
    for got, ref in zip(params, params64):
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=1e-4, atol=1e-5 * ref.grad.abs().max().item())


class _OwnNegatives(ContrastiveDivergence):
    def negatives(self, energy, start, generator=None):
        return start.detach() + 0.5


class _OwnAdvance(LangevinSampler):
    def advance(self, x, n_steps, *, generator=None):  # an override that knows nothing of energy_gradients
        return x.detach() + 0.5


CD_FALLBACKS = {  # a CD whose negatives or gradient must not come from the contrastive chain, and why
    "persistent": lambda: ebmcore.registry.get("loss", "persistent_contrastive_divergence")(
        n_steps=3, sampler_options={"step_size": 0.01}, buffer_size=64
    ),  # chains start in the buffer, not at the data
    "gradient-clip": lambda: ebmcore.registry.get("loss", "contrastive_divergence")(
        n_steps=3, sampler_options={"step_size": 0.01}, gradient_clip=0.5
    ),  # the sampler sees a clipped view
    "per-step": lambda: ebmcore.registry.get("loss", "contrastive_divergence")(
        n_steps=3, sampler_options={"step_size": 0.01, "fused": False}
    ),
    "own-negatives": lambda: _OwnNegatives(n_steps=3),
    "own-advance": lambda: ebmcore.registry.get("loss", "contrastive_divergence")(lambda e: _OwnAdvance(e, step_size=0.01), 3),
}


@pytest.mark.parametrize("name", sorted(CD_FALLBACKS))
def test_contrastive_divergence_keeps_its_other_paths_where_the_chain_must_not_compute_its_gradient(name, monkeypatch):
    """Persistent chains, a clipped gradient, the per-step loop and overridden negatives or advance: no
    ``feedforward_contrastive_chain``; the loss is still the formula on the negatives it drew, gradient included."""
    monkeypatch.setattr(contrastive_op, "feedforward_contrastive_chain", lambda *args: pytest.fail("the contrastive chain ran"))
    energy = Net(_network(2, [16, 16], "silu"))
    data = torch.randn(64, 2, generator=torch.Generator().manual_seed(6))
    loss = CD_FALLBACKS[name]()
    value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    if name.startswith("own"):
        assert torch.equal(loss.last_negatives, data + 0.5)
    value.backward()
    energy64 = Net(_network(2, [16, 16], "silu")).double()
    energy64.load_state_dict(energy.state_dict())
    expected = energy64.compute_energy(data.double()).mean() - energy64.compute_energy(loss.last_negatives.double()).mean()
    torch.testing.assert_close(value.double(), expected.detach(), rtol=1e-5, atol=1e-6)
    expected.backward()
    scale = max(p.grad.abs().max().item() for p in energy64.parameters())  # float32 sums: relative to the largest
    for got, ref in zip(energy.parameters(), energy64.parameters()):
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("name", ["dsm-one-level", "ssm-gaussian", "cd-regularised"])
def test_second_derivatives_through_a_kernel_loss_equal_the_torch_paths(name):
    """A gradient penalty: ``L + Σ|∂L/∂θ|²`` differentiated again (``create_graph=True``) is the same on both paths."""
    data = torch.randn(64, 2, generator=torch.Generator().manual_seed(6))
    results = {}
    for backends in (("cpu_fused", "torch"), ("torch",)):
        energy = Net(_network(2, [16, 16], "silu"))
        with ebmcore.use_backend(*backends):
            value = LOSSES[name]()(energy, data, generator=torch.Generator().manual_seed(1))
            params = list(energy.parameters())
            grads = torch.autograd.grad(value, params, create_graph=True, allow_unused=True)
            total = value + sum((g * g).sum() for g in grads if g is not None)
            total.backward()
        results[backends[0]] = [p.grad for p in params]
    for fused, reference_grad in zip(results["cpu_fused"], results["torch"]):
        assert (fused is None) == (reference_grad is None)
        if reference_grad is not None:
            torch.testing.assert_close(fused, reference_grad, rtol=1e-4, atol=1e-5 * reference_grad.abs().max().item())


def test_a_kernel_loss_keeps_autograds_safety_checks():
    energy = Net(_network(2, [16, 16], "silu"))
    data = torch.randn(32, 2)
    value = DenoisingScoreMatching(0.1)(energy, data, generator=torch.Generator().manual_seed(0))
    value.backward()
    with pytest.raises(RuntimeError, match="second time"):  # no retain_graph
        value.backward()
    value = DenoisingScoreMatching(0.1)(energy, data, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        energy.net[0].weight.add_(1.0)  # the weights change before the backward pass
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        value.backward()


def test_under_no_grad_the_losses_take_the_torch_path():
    energy = Net(_network(2, [16, 16], "silu"))
    with torch.no_grad():
        value = DenoisingScoreMatching(0.1)(energy, torch.randn(32, 2), generator=torch.Generator().manual_seed(0))
    assert value.grad_fn is None and torch.isfinite(value)


def test_an_ambient_autocast_keeps_the_network_in_torch():
    energy = Net(_network(2, [16, 16], "silu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        path = LangevinSampler(energy, step_size=0.01).prepare(torch.randn(4, 2), None, {}).path
    assert "torch.autocast is on" in path and path.startswith("per-step loop")


def test_hooked_layers_keep_autograd():
    """weight_norm recomputes the weight in a forward pre-hook: the plan would differentiate a stale copy."""
    net = _network(2, [8], "silu")
    with warnings.catch_warnings():  # deprecated in favour of parametrizations (whose modules the plan refuses by type)
        warnings.simplefilter("ignore", FutureWarning)
        net[0] = torch.nn.utils.weight_norm(net[0])
    assert "forward hooks" in feedforward.why_not(Net(net).program(), torch.randn(4, 2))


def test_the_loss_kernels_give_the_same_bits_for_the_same_thread_count():
    net = _network(2, [64, 64], "silu")
    x, v = torch.randn(1000, 2, generator=torch.Generator().manual_seed(0)), torch.randn(1000, 2)
    W, B = [m.weight for m in net if isinstance(m, nn.Linear)], [m.bias for m in net if isinstance(m, nn.Linear)]
    c = (torch.full((1000,), 1e-3), None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        runs = [feedforward_ops.feedforward_sliced_score_matching(x, v, W, B, [0, 0], 1.0) for _ in range(6)]
        chains = [
            contrastive_op.feedforward_contrastive_chain(x, c, c, W, B, [0, 0], 1.0, 3, 0.01, 0.1, None, None, 5, 0)
            for _ in range(4)
        ]
    finally:
        torch.set_num_threads(threads)
    for value, grad_w, _ in runs[1:]:
        assert torch.equal(value, runs[0][0]) and all(torch.equal(a, b) for a, b in zip(grad_w, runs[0][1]))
    flat = [[*run[:4], *run[4], *run[5]] for run in chains]  # states, both energies, loss, every weight and bias gradient
    for run in flat[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, flat[0]))


def _loss_op_arguments(op, x, generator):
    n, d = x.shape

    def draw(*shape):
        return torch.randn(*shape, generator=generator)

    return {
        "feedforward_denoising_score_matching": lambda: ((x, draw(n, d), draw(n).abs() + 0.5), {}),
        "feedforward_sliced_score_matching": lambda: ((x, draw(n, d)), {}),
        "feedforward_energy_gradients": lambda: ((x, draw(n), draw(n)), {}),
        "feedforward_contrastive_chain": lambda: (
            (x,),
            {
                "n_steps": 3,
                "step_size": 0.01,
                "noise_scale": 0.1,
                "seed": 5,
                "offset": 2,
                "start": (0.5, 0.1),
                "end": (-0.5, None),
            },
        ),
    }[op]()


@pytest.mark.parametrize("op", sorted(LOSS_OPS))
def test_every_loss_op_of_the_host_build_equals_its_definition(op):
    """Each fused op of the losses (``ebm_losses.ops.LOSS_OPS``) against its torch reference in float64, on a network
    with a negated output and both activation kinds; the contrastive chain's moves are the Langevin chain's."""
    import copy

    torch.manual_seed(0)
    energy = Net(_network(3, [16, 8], "silu"), sign=-1.0)
    energy.net[3] = nn.Tanh()
    x = torch.randn(37, 3, generator=torch.Generator().manual_seed(1))
    args, kwargs = _loss_op_arguments(op, x, torch.Generator().manual_seed(2))
    program = energy.program()
    kernel = ebmcore.resolve_kernel(op, x.device, x.dtype)
    got = kernel.fn(args[0], program, *args[1:], **kwargs) if op == "feedforward_contrastive_chain" else kernel.fn(*args, program)
    twin = copy.deepcopy(energy).double()
    ref_args = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    if op == "feedforward_contrastive_chain":
        chain = ebmcore.resolve_kernel("feedforward_langevin_chain", x.device, x.dtype).fn
        kwargs["chain"] = lambda x64, _, **kw: chain(x64.float(), program, **kw).double()
        expected = LOSS_OPS[op].reference(ref_args[0], twin.program(), **kwargs)
    else:
        expected = LOSS_OPS[op].reference(*ref_args, twin.program())
    flat = lambda out: [t for item in out for t in (item if isinstance(item, list) else [item])]  # noqa: E731
    got, expected = flat(got), flat(expected)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            scale = e.abs().max().clamp_min(1e-3)
            torch.testing.assert_close(g.double() / scale, e / scale, rtol=0, atol=5e-5)


@pytest.mark.parametrize("d, widths", [(1, [64, 64]), (8, [64, 64]), (9, [64, 64]), (2, [17, 64]), (8, [3, 5])])
def test_the_denoising_first_layer_gradient_either_side_of_few_inputs(d, widths):
    """The first layer's weight gradient is summed as columns over the outputs for inputs up to eight wide (the
    host build's SMALL_INPUT) and as outer products over the inputs above; the two hidden layers' products in one pass.
    Both equal nested autograd, at widths that are and are not whole blocks of 16, on a batch that is not whole tiles."""
    test_the_denoising_loss_and_its_gradients_equal_autograds("silu", d, widths, 37, True, -1.0, True)
