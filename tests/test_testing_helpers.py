"""The contract checks in ebmcore.testing catch broken components (they are tests that can fail)."""

import math
from dataclasses import dataclass

import pytest
import torch

import ebmcore
from ebmcore import Kernel, KernelBackend
from ebmcore.errors import InputError, NonFiniteError
from ebmcore.testing import check_energy, check_kernel, check_loss, check_sampler


@dataclass
class State:
    x: torch.Tensor


class ULA(ebmcore.Sampler):
    def __init__(self, energy, step_size=0.05, use_generator=True):
        super().__init__(energy)
        self.h, self.use_generator = step_size, use_generator

    def init(self, x):
        return State(x)

    def step(self, state, *, generator=None):
        g = generator if self.use_generator else None
        noise = torch.randn(state.x.shape, dtype=state.x.dtype, generator=g)
        return State(state.x - self.h * self.energy.compute_gradient(state.x) + math.sqrt(2 * self.h) * noise), {}


class WrongGradient(ebmcore.EnergyModel):
    event_shape = (2,)

    def compute_energy(self, x):
        return (x**2).sum(-1)

    def compute_gradient(self, x, create_graph=False):
        return x  # should be 2x


class MeanLoss(ebmcore.Loss):
    def __call__(self, energy, data, *, generator=None):
        return energy.energy(data).mean()


def test_check_sampler_accepts_a_correct_sampler_and_catches_an_ignored_generator():
    check_sampler(lambda e: ULA(e))
    with pytest.raises(AssertionError, match="same generator seed must give identical chains"):
        check_sampler(lambda e: ULA(e, use_generator=False), check_moments=False)


def test_check_sampler_catches_a_wrong_stationary_distribution():
    with pytest.raises(AssertionError, match="variance"):
        check_sampler(lambda e: ULA(e, step_size=0.8))  # ULA's bias at a large step: variance 1/(1-h/2) = 1.67


def test_check_energy_catches_a_wrong_gradient():
    check_energy(ebmcore.HarmonicEnergy(dim=2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64))
    with pytest.raises(AssertionError, match="gradient vs autograd"):
        check_energy(WrongGradient(), torch.randn(8, 2, dtype=torch.float64))


def test_check_loss():
    check_loss(MeanLoss)

    class Constant(ebmcore.Loss):
        def __call__(self, energy, data, *, generator=None):
            return energy.energy(data).mean() * 0.0

    with pytest.raises(AssertionError, match="all parameter gradients are zero"):
        check_loss(Constant)


def test_check_kernel_catches_a_wrong_kernel():
    wrong = KernelBackend("wrong", [Kernel("double_well_gradient", lambda x, b: 4 * b * x**3, device_types=("cpu",))])
    with pytest.raises(AssertionError, match=r"wrong.double_well_gradient\[float32\] vs torch reference"):
        check_kernel(wrong)
    cuda_only = KernelBackend("c", [Kernel("double_well_gradient", lambda x, b: x, device_types=("cuda",))])
    with pytest.raises(AssertionError, match="could run none of its kernels"):
        check_kernel(cuda_only)


def test_sampler_base_rejects_bad_energies_and_initial_states():
    with pytest.raises(InputError, match="needs an ebmcore.EnergyModel"):
        ULA(lambda x: x)
    sampler = ULA(ebmcore.HarmonicEnergy(dim=2))
    x0 = torch.zeros(4, 2)
    x0[2] = float("inf")
    with pytest.raises(NonFiniteError, match=r"initial state x0 is non-finite .* rows \[2\]"):
        sampler.sample(x0, 10)
    with pytest.raises(InputError, match=r"x0 must have shape \(n, 2\)"):
        sampler.sample(torch.zeros(4, 3), 10)
    with pytest.raises(InputError, match="n_steps must be .*a non-negative integer"):
        sampler.sample(torch.zeros(4, 2), -1)


def test_integrator_capabilities_give_exact_errors():
    class Heun(ebmcore.Integrator):
        name, kind, order = "heun", "ode", 2

    Heun().require(kind="ode")
    with pytest.raises(InputError, match="integrator 'heun' integrates ode dynamics but HMC needs a hamiltonian"):
        Heun().require(kind="hamiltonian", user="HMC")


def test_the_loop_counts_what_an_info_reports_and_nothing_else():
    from types import SimpleNamespace

    class Lazy(ebmcore.Sampler):  # accepts every other step; reports acceptance as a float, and no divergences
        def init(self, x):
            return SimpleNamespace(x=x)

        def step(self, state, *, generator=None, **tunables):
            self.calls = getattr(self, "calls", 0) + 1
            return SimpleNamespace(x=state.x + 1), SimpleNamespace(accepted=float(self.calls % 2))

    res = Lazy(ebmcore.HarmonicEnergy(dim=2)).sample(torch.zeros(4, 2), 4, return_diagnostics=True)
    assert res.diagnostics.acceptance.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert res.diagnostics.acceptance_rate.tolist() == [0.5] * 4 and res.diagnostics.divergences.tolist() == [0] * 4
    assert torch.equal(res.samples, torch.full((4, 2), 4.0))
