"""Issue 40: bad inputs that ended in a Python or torch traceback are ebmcore errors naming the problem and the fix,
raised once, where the entry point meets them."""

import warnings

import pytest
import torch
from torch import nn

from ebmcore import EnergyModel, SequentialEnergy
from ebmcore.energies.program import feedforward_of
from ebmcore.errors import InputError
from ebmcore.sampler import check_run_arguments
from ebmcore.testing import check_program


class NoneGradient(EnergyModel):
    event_shape = (2,)

    def compute_energy(self, x):
        return x.square().sum(1)

    def compute_gradient(self, x, create_graph=False):
        return None


class Detached(EnergyModel):
    event_shape = (2,)

    def compute_energy(self, x):
        return x.detach().square().sum(1)


class ParametersOnly(EnergyModel):  # a graph through its parameter, none through x
    event_shape = (2,)

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def compute_energy(self, x):
        return (x.detach() * self.w).sum(1)


def network():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.SiLU(), nn.Linear(8, 1))


class TwoDtypes(EnergyModel):
    event_shape = (2,)

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 8), nn.Linear(8, 1).double()

    def compute_energy(self, x):
        return self.b(torch.tanh(self.a(x))).squeeze(-1)


class Liar(EnergyModel):
    event_shape = (2,)

    def __init__(self):
        super().__init__()
        self.net = network()

    def compute_energy(self, x):
        return 2 * self.net(x).squeeze(-1)

    def program(self):
        return feedforward_of(self.net)


X = torch.randn(4, 2)


def test_a_gradient_of_none_is_named_not_an_attribute_error():
    with pytest.raises(InputError, match=r"NoneGradient's gradient is a NoneType .* compute_gradient\(x\) must return"):
        NoneGradient().gradient(X)
    with pytest.raises(InputError, match="NoneGradient's gradient is a NoneType"):
        NoneGradient().compute_energy_and_gradient(X)  # what every sampler's init and step call


@pytest.mark.parametrize("energy", [Detached, ParametersOnly])
def test_an_energy_without_a_graph_to_x_names_compute_energy_and_the_fix(energy):
    with pytest.raises(InputError, match=rf"{energy.__name__}.compute_energy\(x\) .*x.detach\(\).*override compute_gradient"):
        energy().gradient(X)
    with pytest.raises(InputError, match=rf"{energy.__name__}.compute_energy\(x\)"):
        energy().compute_energy_and_gradient(X, create_graph=True)


def test_a_callback_that_cannot_be_called_is_an_input_error():
    with pytest.raises(InputError, match=r"callback must be a function callback\(step_index, state, info\) or None, got int 42"):
        check_run_arguments(X, 3, callback=42)
    check_run_arguments(X, 3, callback=lambda *a: None)


@pytest.mark.parametrize("make", [lambda: SequentialEnergy(network()), TwoDtypes], ids=["sequential", "opaque"])
def test_a_layer_in_another_dtype_is_named_at_every_checked_entry(make):
    energy = make()
    if isinstance(energy, SequentialEnergy):
        energy.net[2].double()
    layer = "net.2" if isinstance(energy, SequentialEnergy) else "b"
    match = rf"layer '{layer}' \(Linear\) holds parameter '{layer}.weight' in torch.float64 .* model.to\(torch.float32\)"
    for call in (energy.energy, energy.gradient, energy.score, energy.energy_and_gradient, energy):
        with pytest.raises(InputError, match=match):
            call(X)


def test_check_program_names_a_program_that_does_not_compute_compute_energy():
    with pytest.raises(AssertionError, match=r"Liar.program\(\) does not compute what Liar.compute_energy does"):
        check_program(Liar(), X)


@pytest.mark.parametrize("modify", ["weight_norm", "prune"])
def test_check_program_on_a_model_torch_cannot_copy_names_the_fix(modify):
    import torch.nn.utils.prune  # noqa: F401

    net = network()
    if modify == "weight_norm":
        with warnings.catch_warnings():  # deprecated in favour of the parametrization: what issue 40 probed
            warnings.simplefilter("ignore")
            torch.nn.utils.weight_norm(net[0])
    else:
        torch.nn.utils.prune.l1_unstructured(net[0], "weight", amount=0.5)
    with pytest.raises(InputError, match=r"parametrizations.weight_norm .*prune.remove\(module, 'weight'\)"):
        check_program(SequentialEnergy(net), X)
