"""What a loss call reads of its energy each time, kept between calls where nothing it depends on changed: the
feed-forward program of a network (``ebmcore.energies.program.feedforward_of``), and the one walk of a model's
parameters that ``EnergyModel.validate`` makes. Each kept value is held to a fresh read after every kind of change
that must invalidate it."""

import pytest
import torch
from torch import nn

import ebmcore
from ebmcore.energies import program as programs
from ebmcore.energies.base import closed_form_program
from ebmcore.energies.program import ActivationKind, FeedForward, Opaque
from ebmcore.errors import InputError


def _net(activation=nn.SiLU):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), activation(), nn.Linear(8, 8), activation(), nn.Linear(8, 1))


def _fresh(net, sign=1.0):
    """The program read from the modules, past the cache."""
    return programs._read_feedforward(net, sign)


def test_an_unchanged_network_gives_the_same_program_object_equal_to_a_fresh_read():
    net = _net()
    first = programs.feedforward_of(net)
    assert isinstance(first, FeedForward)
    assert programs.feedforward_of(net) is first and first == _fresh(net)
    with torch.no_grad():  # an optimizer step: the weights change in place, the program (which holds the modules) stays
        net[0].weight.add_(1.0)
    assert programs.feedforward_of(net) is first
    assert programs.feedforward_of(net, -1.0) == _fresh(net, -1.0) and programs.feedforward_of(net, -1.0).sign == -1.0


def test_a_replaced_layer_is_read_anew():
    net = _net()
    before = programs.feedforward_of(net)
    net[2] = nn.Linear(8, 8)
    after = programs.feedforward_of(net)
    assert after is not before and after.layers[1].linear is net[2] and after == _fresh(net)
    net[1] = nn.Tanh()
    assert programs.feedforward_of(net).layers[0].activation.kind is ActivationKind.TANH
    net[4] = nn.Linear(8, 2)  # no longer ends in Linear(·, 1)
    assert isinstance(programs.feedforward_of(net), Opaque)
    net.append(nn.Linear(2, 1))  # an added layer
    assert isinstance(programs.feedforward_of(net), Opaque)  # two Linear layers in a row


@pytest.mark.parametrize(
    "register",
    [
        lambda m: m.register_forward_hook(lambda *a: None),
        lambda m: m.register_forward_pre_hook(lambda *a: None),
        lambda m: m.register_full_backward_hook(lambda *a: None),
        lambda m: m.register_full_backward_pre_hook(lambda *a: None),
    ],
    ids=["forward", "forward-pre", "backward", "backward-pre"],
)
@pytest.mark.parametrize("where", ["layer", "network"])
def test_a_hook_registered_after_a_first_read_makes_the_program_opaque_until_removed(register, where):
    net = _net()
    assert isinstance(programs.feedforward_of(net), FeedForward)
    handle = register(net[2] if where == "layer" else net)
    program = programs.feedforward_of(net)
    assert isinstance(program, Opaque) and "hooks" in program.reason
    handle.remove()
    assert isinstance(programs.feedforward_of(net), FeedForward)


def test_global_hooks_and_parametrizations_after_a_first_read_make_it_opaque():
    net = _net()
    assert isinstance(programs.feedforward_of(net), FeedForward)
    handle = nn.modules.module.register_module_full_backward_hook(lambda *a: None)
    try:
        assert "global backward hooks" in programs.feedforward_of(net).reason
    finally:
        handle.remove()
    assert isinstance(programs.feedforward_of(net), FeedForward)
    nn.utils.parametrizations.weight_norm(net[2])
    assert "parametrized" in programs.feedforward_of(net).reason


def test_a_changed_activation_setting_is_read_anew():
    net = _net(lambda: nn.LeakyReLU(0.1))
    assert programs.feedforward_of(net).layers[0].activation.params == (pytest.approx(0.1),)
    net[1].negative_slope = 0.3
    assert programs.feedforward_of(net).layers[0].activation.params == (pytest.approx(0.3),)
    assert programs.feedforward_of(net) == _fresh(net)


def test_the_energys_program_follows_negate_and_the_closed_form_follows_a_dtype_change():
    energy = ebmcore.SequentialEnergy(_net())
    x = torch.randn(5, 2)
    assert energy.program().sign == 1.0
    energy.negate = True
    assert energy.program().sign == -1.0
    assert closed_form_program(energy, x)[0] is not None
    energy.double()  # the parameters retyped in place (same Parameter objects): the inputs no longer fit
    plan, why = closed_form_program(energy, x)
    assert plan is None and "float64" in why
    assert closed_form_program(energy, x.double())[0] is not None


def test_a_collected_network_leaves_no_program_behind():
    import gc

    net = _net()
    programs.feedforward_of(net)
    assert net in programs._PROGRAMS
    n = len(programs._PROGRAMS)
    del net
    gc.collect()
    assert len(programs._PROGRAMS) == n - 1


def test_validate_walks_the_tree_once_and_still_names_a_mismatched_layer():
    energy = ebmcore.SequentialEnergy(_net())
    energy.validate(torch.randn(3, 2))
    energy.net[2].double()  # one layer in another dtype, after a first check
    with pytest.raises(InputError, match=r"layer 'net\.2' \(Linear\)"):
        energy.validate(torch.randn(3, 2))
    energy.double()
    with pytest.raises(InputError, match="float64"):  # the inputs' dtype is now the model's, float64
        energy.validate(torch.randn(3, 2))
    energy.validate(torch.randn(3, 2, dtype=torch.float64))


def test_validate_of_a_shared_layer_and_of_buffers_only():
    shared = nn.Linear(2, 2)
    net = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), nn.Linear(2, 1))  # one module twice
    ebmcore.SequentialEnergy(net).validate(torch.randn(3, 2))

    class Buffered(ebmcore.EnergyModel):  # no parameters: the first floating buffer fixes the dtype
        event_shape = (2,)

        def __init__(self):
            super().__init__()
            self.inner = nn.Module()
            self.inner.register_buffer("centre", torch.zeros(2, dtype=torch.float64))

        def compute_energy(self, x):
            return ((x - self.inner.centre) ** 2).sum(1)

    Buffered().validate(torch.randn(3, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="float64"):
        Buffered().validate(torch.randn(3, 2))


def test_a_layers_weight_and_bias_are_read_as_getattr_reads_them():
    linear = nn.Linear(3, 2)
    layer = programs.Layer(linear, None)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    linear.weight = nn.Parameter(torch.ones(2, 3))  # replaced
    assert layer.weight is linear.weight and torch.equal(layer.weight, torch.ones(2, 3))
    del linear.weight
    linear.weight = torch.zeros(2, 3)  # a plain tensor attribute, as a functional call leaves it
    assert layer.weight is linear.weight and not isinstance(layer.weight, nn.Parameter)
    with torch.nn.utils.stateless._reparametrize_module(linear, {"bias": torch.full((2,), 7.0)}):
        assert layer.bias is linear.bias and torch.equal(layer.bias, torch.full((2,), 7.0))
    assert layer.bias is linear.bias
    assert programs.Layer(nn.Linear(3, 1, bias=False), None).bias is None
