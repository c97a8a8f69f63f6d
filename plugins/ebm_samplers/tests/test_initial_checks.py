"""What every sampler checks once per run, before its first step: the energy's output shape and a finite energy at x0."""

import pytest
import torch
from torch import nn

import ebmcore
from ebm_samplers import (
    AnnealedLangevinSampler,
    HMCSampler,
    LangevinSampler,
    MALASampler,
    NUTSSampler,
    ParallelTemperingSampler,
    warmup,
)
from ebmcore.errors import InputError, NonFiniteError

SAMPLERS = {
    "langevin": lambda e: LangevinSampler(e, step_size=0.01, fused=False),
    "langevin-fused": lambda e: LangevinSampler(e, step_size=0.01),
    "mala": lambda e: MALASampler(e, step_size=0.1),
    "hmc": lambda e: HMCSampler(e, step_size=0.1, n_leapfrog_steps=2, fused=False),
    "hmc-fused": lambda e: HMCSampler(e, step_size=0.1, n_leapfrog_steps=2),
    "nuts": lambda e: NUTSSampler(e, step_size=0.1, max_tree_depth=3),
    "tempering": lambda e: ParallelTemperingSampler(e, "mala", n_replicas=2),
    "annealed": lambda e: AnnealedLangevinSampler(e, [1.0, 0.1], n_steps_each=2),
}


class Net(ebmcore.EnergyModel):
    """A small network whose output is ``(n, 1)`` (a final ``Linear(…, 1)``), a scalar (summed over the batch) or
    ``(n, 2)``."""

    event_shape = (2,)

    def __init__(self, output: str) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2 if output == "(n, 2)" else 1)
        self.output = output

    def compute_energy(self, x):
        e = self.layer(x).square()
        return e.sum() if self.output == "scalar" else e


FIXES = {
    "(n, 1)": r"returned shape \(6, 1\) .*shape \(6,\)\. End compute_energy with \.squeeze\(-1\)",
    "scalar": r"returned shape \(\) .*reduced over the batch.*\.squeeze\(-1\)",
    "(n, 2)": r"returned shape \(6, 2\) .*\.squeeze\(-1\), or sum the per-output terms",
}


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("output", FIXES)
def test_an_energy_that_is_not_one_value_per_row_is_refused_before_the_first_step(name, output):
    calls = []
    sampler = SAMPLERS[name](Net(output))
    with pytest.raises(InputError, match=FIXES[output]):
        sampler.sample(torch.randn(6, 2), 5, callback=lambda *args: calls.append(args))
    assert calls == []  # refused before any step


@pytest.mark.parametrize("name", ["mala", "hmc", "nuts"])
def test_warmup_refuses_it_too(name):
    with pytest.raises(InputError, match=r"\.squeeze\(-1\)"):
        warmup(SAMPLERS[name](Net("(n, 1)")), torch.randn(6, 2), 30)


class Holey(ebmcore.EnergyModel):
    """A Gaussian with a NaN region ``x₀ > 1.5`` (autograd gradient)."""

    event_shape = (2,)

    def compute_energy(self, x):
        e = 0.5 * (x * x).sum(-1)
        return torch.where(x[:, 0] > 1.5, torch.full_like(e, float("nan")), e)


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_non_finite_energy_at_a_finite_x0_is_an_error_naming_the_rows(name):
    x0 = torch.zeros(6, 2)
    x0[4, 0] = 2.0  # finite, but where the energy is NaN
    with pytest.raises(NonFiniteError, match=r"Holey energy at the initial state x0 .* rows \[4\]. The inputs there are finite"):
        SAMPLERS[name](Holey()).sample(x0, 5)


@pytest.mark.parametrize("name", ["langevin", "langevin-fused", "hmc", "hmc-fused"])
def test_the_fused_and_per_step_paths_check_alike(name):
    energy = ebmcore.energy("double_well", dim=2)
    x0 = torch.zeros(6, 2)
    x0[2, 1] = 1e30  # finite; its fourth power overflows float32
    sampler = SAMPLERS[name](energy)
    path = sampler.prepare(x0, None, {}).path
    if name.endswith("fused") and path != "fused chain":
        pytest.skip(f"no fused chain here: {path}")
    assert (path == "fused chain") == name.endswith("fused")
    with pytest.raises(NonFiniteError, match=r"DoubleWellEnergy energy at the initial state x0 .* rows \[2\]"):
        sampler.sample(x0, 5)


class WrongGradient(ebmcore.EnergyModel):
    """``E = ½|x|²`` with a hand-written gradient of shape ``(n, 1)``: it would broadcast into ``x − h∇E``."""

    event_shape = (2,)

    def compute_energy(self, x):
        return 0.5 * x.square().sum(-1)

    def compute_gradient(self, x, create_graph=False):
        return x.sum(-1, keepdim=True)


class IntegerEnergy(ebmcore.EnergyModel):
    """An energy returned as int64 (rounded)."""

    event_shape = (2,)

    def compute_energy(self, x):
        return x.square().sum(-1).round().long()


WITH_HMC_BASE = {**SAMPLERS, "tempering-hmc": lambda e: ParallelTemperingSampler(e, "hmc", n_replicas=2)}


@pytest.mark.parametrize("name", WITH_HMC_BASE)
def test_a_gradient_not_shaped_like_x_is_refused_by_every_sampler(name):
    calls = []
    sampler = WITH_HMC_BASE[name](WrongGradient())
    with pytest.raises(
        InputError,
        match=r"gradient is shape \(6, 1\) for x of shape \(6, 2\); compute_gradient\(x\) must "
        r"return a tensor shaped like x",
    ):
        sampler.sample(torch.randn(6, 2), 5, callback=lambda *args: calls.append(args))
    assert calls == []  # no step was made with it


@pytest.mark.parametrize("name", WITH_HMC_BASE)
def test_an_integer_energy_is_refused_by_every_sampler_with_the_same_words(name):
    with pytest.raises(
        InputError,
        match=r"IntegerEnergy\.compute_energy\(x\) returned dtype torch\.int64; energies must "
        r"be floating point",
    ):
        WITH_HMC_BASE[name](IntegerEnergy()).sample(torch.randn(6, 2), 5)


class CastGradient(ebmcore.EnergyModel):
    """``E = ½|x|²`` with a hand-written gradient cast to ``dtype``: an integer one truncates every step."""

    event_shape = (2,)

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def compute_energy(self, x):
        return 0.5 * x.square().sum(-1)

    def compute_gradient(self, x, create_graph=False):
        return x.to(self.dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
@pytest.mark.parametrize("name", WITH_HMC_BASE)
def test_a_gradient_of_another_dtype_is_refused_by_every_sampler(name, dtype):
    calls = []
    sampler = WITH_HMC_BASE[name](CastGradient(dtype))
    with pytest.raises(
        InputError,
        match=rf"gradient has dtype {dtype} for x of dtype torch\.float32; "
        r"compute_gradient\(x\) must return ∇ₓE in x's dtype",
    ):
        sampler.sample(torch.randn(6, 2), 5, callback=lambda *args: calls.append(args))
    assert calls == []  # no step was made with it
    with pytest.raises(InputError, match="compute_gradient"):
        CastGradient(dtype).gradient(torch.randn(6, 2))


class _NoneGradient(ebmcore.EnergyModel):
    event_shape = (2,)

    def compute_energy(self, x):
        return x.square().sum(1)

    def compute_gradient(self, x, create_graph=False):
        return None


class _Detached(ebmcore.EnergyModel):
    event_shape = (2,)

    def compute_energy(self, x):
        return x.detach().square().sum(1)


@pytest.mark.parametrize("name", ["mala", "hmc", "nuts", "tempering"])
def test_a_gradient_of_none_or_without_a_graph_is_named_by_every_sampler(name):
    """Issue 40: an AttributeError ('NoneType' has no attribute 'detach') and autograd's 'element 0 of tensors does
    not require grad'."""
    with pytest.raises(InputError, match=r"_NoneGradient's gradient is a NoneType"):
        SAMPLERS[name](_NoneGradient()).sample(torch.randn(6, 2), 2)
    with pytest.raises(InputError, match=r"_Detached\.compute_energy\(x\) has no autograd graph.*x\.detach\(\)"):
        SAMPLERS[name](_Detached()).sample(torch.randn(6, 2), 2)


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_callback_that_is_not_callable_is_refused_before_the_first_step(name):
    with pytest.raises(InputError, match=r"callback must be a function callback\(step_index, state, info\) or None, got int 42"):
        SAMPLERS[name](Net("(n, 2)")).sample(torch.randn(6, 2), 2, callback=42)
