"""The per-call work a loss kernel of the host build keeps or skips (issue 42: W7's Python overhead): the network's
C description kept by its pointers (``network_layers._network``), the op's host implementation called directly in
eager mode (``network_layers.eager_host``), and the energy's program kept while its modules are unchanged. Each is
held to the uncached path after the changes that must reach it: an optimizer step (weights changed in place), a
replaced parameter, a backward hook registered after a first call, a retyped model; and the op is still what a
trace, a fake tensor or a dispatch mode sees."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ebmcore
from ebm_cuda import feedforward_ops, library, network_layers
from ebm_losses import DenoisingScoreMatching, SlicedScoreMatching

pytestmark = pytest.mark.skipif(library.host_unavailable_reason() is not None, reason="no host build")

LOSSES = {"dsm": lambda: DenoisingScoreMatching(0.1), "ssm": lambda: SlicedScoreMatching(projection="rademacher")}


def _energy(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 1))
    return ebmcore.SequentialEnergy(net)


def _data():
    return torch.randn(128, 2, generator=torch.Generator().manual_seed(3))


def _kernel_ran(value) -> bool:
    return value.grad_fn is not None and "_GivenGradients" in type(value.grad_fn).__name__


def _value_and_grads(loss, energy, data, backends=("cpu_fused", "torch")):
    with ebmcore.use_backend(*backends):
        value = loss(energy, data, generator=torch.Generator().manual_seed(1))
    ran = _kernel_ran(value)
    energy.zero_grad(set_to_none=True)
    value.backward()
    return value.detach(), [None if p.grad is None else p.grad.clone() for p in energy.parameters()], ran


def _assert_matches_torch(loss, energy, data):
    """The kernel's value and gradients against the torch path's, now (with the energy as it is)."""
    value, grads, ran = _value_and_grads(loss, energy, data)
    reference, reference_grads, _ = _value_and_grads(loss, energy, data, ("torch",))
    assert ran
    torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, reference_grads):
        assert (g is None) == (r is None)
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * r.abs().max().item())
    return value, grads


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_after_optimizer_steps_each_call_sees_the_new_weights(name):
    energy, data, loss = _energy(), _data(), LOSSES[name]()
    opt = torch.optim.SGD(energy.parameters(), lr=0.5)
    before, _ = _assert_matches_torch(loss, energy, data)
    described = len(network_layers._DESCRIBED)
    for _ in range(3):  # steps in place: same tensors, same pointers, new values
        _value_and_grads(loss, energy, data)
        opt.step()
        after, _ = _assert_matches_torch(loss, energy, data)
    assert not torch.equal(after, before)  # the steps moved the loss: the kernel read the new weights
    assert len(network_layers._DESCRIBED) == described  # and reused the network's C description


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_replaced_parameter_is_the_one_read_and_given_the_gradient(name):
    energy, data, loss = _energy(), _data(), LOSSES[name]()
    _assert_matches_torch(loss, energy, data)
    old = energy.net[2].weight
    energy.net[2].weight = nn.Parameter(old.detach() * 1.5)
    old.grad = None  # (the first call's)
    value, grads = _assert_matches_torch(loss, energy, data)
    assert old.grad is None and energy.net[2].weight.grad is not None  # the new parameter, not the old one
    energy.net[2].weight = old  # and back: the first description again, the first value
    torch.testing.assert_close(_value_and_grads(loss, energy, data)[0], _assert_matches_torch(loss, energy, data)[0])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_backward_hook_registered_after_a_first_call_makes_the_loss_fall_back(name):
    energy, data, loss = _energy(), _data(), LOSSES[name]()
    assert _value_and_grads(loss, energy, data)[2]  # the kernel ran
    calls = []
    handle = energy.net[2].register_full_backward_hook(lambda module, grad_in, grad_out: calls.append(1))
    value, grads, ran = _value_and_grads(loss, energy, data)
    assert not ran and calls  # autograd ran the network, so the hook saw its backward pass
    reference, reference_grads, _ = _value_and_grads(loss, energy, data, ("torch",))
    torch.testing.assert_close(value, reference)
    handle.remove()
    assert _value_and_grads(loss, energy, data)[2]  # the kernel again once the hook is gone


def test_a_retyped_model_takes_the_torch_path_and_back():
    energy, data, loss = _energy(), _data(), DenoisingScoreMatching(0.1)
    first = _assert_matches_torch(loss, energy, data)[0]
    energy.double()  # same Parameter objects, float64 now: the float32 kernel does not take it
    value, _, ran = _value_and_grads(loss, energy, data.double())
    assert not ran and value.dtype == torch.float64
    energy.float()
    torch.testing.assert_close(_assert_matches_torch(loss, energy, data)[0], first)


def _args(seed=0):
    energy = _energy(seed)
    x = _data()
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    return x, target, energy.program()


def test_the_eager_call_equals_the_ops_to_the_bit():
    x, target, program = _args()
    eager = feedforward_ops._dsm_kernel(x, target, None, program)
    through_op = feedforward_ops.feedforward_denoising_score_matching(x, target, None, *network_layers.layers(program))
    assert torch.equal(eager[0], through_op[0]) and eager[0].dtype == torch.float32 and eager[0].dim() == 0
    for a, b in zip(eager[1] + eager[2], through_op[1] + through_op[2]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert eager[2][-1] is None  # no output-bias gradient, as autograd leaves it


class _Recording(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_a_fake_tensor_and_a_gradient_see_the_op():
    x, target, program = _args()
    with _Recording() as mode:
        feedforward_ops._dsm_kernel(x, target, None, program)
    assert "ebm_cuda.feedforward_denoising_score_matching.default" in mode.ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
        fx, ft = fake_mode.from_tensor(x), fake_mode.from_tensor(target)
        assert not network_layers.eager_host(fx, ft)
        value, grad_w, grad_b = feedforward_ops._dsm_kernel(fx, ft, None, program)
    assert value.shape == () and [g.shape for g in grad_w] == [lin.linear.weight.shape for lin in program.layers]
    assert not network_layers.eager_host(x, target.requires_grad_(True))  # a target that needs a gradient
    assert network_layers.eager_host(x, target.detach(), None)


def test_the_description_cache_is_keyed_by_what_it_holds_and_stays_small():
    x, target, program = _args()
    weights, biases, codes, _ = network_layers.layers(program)
    first, _ = network_layers._network(weights, biases, codes)
    assert network_layers._network(weights, biases, codes)[0] is first
    moved = [w.detach().clone() for w in weights]  # new pointers: a new description pointing at them
    second, keep = network_layers._network(moved, biases, codes)
    assert second is not first and list(second[2]) == [w.data_ptr() for w in moved]
    assert list(second[1]) == [2, 32, 32, 1] and list(second[4]) == list(codes)
    doubles = [w.double() for w in weights]  # converted copies: pointers into the float32 copies it keeps
    third, keep = network_layers._network(doubles, biases, codes)
    assert list(third[2]) == [t.data_ptr() for t in keep[: len(doubles)]]
    for _ in range(2 * network_layers._DESCRIBED_MAX):
        network_layers._network([w.detach().clone() for w in weights], biases, codes)
    assert len(network_layers._DESCRIBED) <= network_layers._DESCRIBED_MAX
