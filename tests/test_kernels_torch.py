"""The torch reference kernels: every gradient op is the derivative of its energy op."""

import pytest
import torch

from ebmcore.kernels.ops import OPS, sample_inputs
from ebmcore.kernels.torch_backend import TorchBackend
from ebmcore.testing import check_kernel

KERNELS = TorchBackend().kernels
ENERGY_OPS = sorted(op for op in OPS if op.endswith("_energy"))


def test_every_op_has_a_reference_and_a_spec():
    assert set(KERNELS) == set(OPS)


@pytest.mark.parametrize("op", ENERGY_OPS)
def test_gradient_op_is_the_autograd_derivative_of_the_energy_op(op):
    x, *params = sample_inputs(op, n=32, d=5)
    xg = x.clone().requires_grad_(True)
    energy = KERNELS[op].fn(xg, *params)
    assert energy.shape == (32,)
    (expected,) = torch.autograd.grad(energy.sum(), xg)
    grad = KERNELS[op.replace("_energy", "_gradient")].fn(x, *params)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-10)


def test_float32_kernels_agree_with_float64():
    checked = check_kernel(TorchBackend(), dtypes=(torch.float32,))
    assert len(checked) == len(OPS)


@pytest.mark.parametrize("op", ENERGY_OPS)
def test_gradient_ops_are_differentiable(op):
    """Hessian-vector products through the gradient op equal double backward through the energy op
    (what score matching with create_graph=True relies on)."""
    x, *params = sample_inputs(op, n=16, d=4)
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    xa = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(KERNELS[op].fn(xa, *params).sum(), xa, create_graph=True)
    (expected,) = torch.autograd.grad((g * v).sum(), xa)
    xb = x.clone().requires_grad_(True)
    (actual,) = torch.autograd.grad((KERNELS[op.replace("_energy", "_gradient")].fn(xb, *params) * v).sum(), xb)
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9)
