"""The closed-form gradient of feed-forward energies (ebmcore.energies.feedforward) against autograd."""

import pytest
import torch
from torch import nn

import ebmcore
from ebmcore import EnergyFunctions
from ebmcore.energies import feedforward
from ebmcore.energies.base import closed_form_program

ACTIVATIONS = [
    nn.SiLU(),
    nn.Tanh(),
    nn.Sigmoid(),
    nn.ReLU(),
    nn.Softplus(),
    nn.Softplus(beta=2.0, threshold=5.0),
    nn.GELU(),
    nn.GELU("tanh"),
    nn.ELU(0.5),
    nn.LeakyReLU(0.1),
]


class Wrapped(ebmcore.SequentialEnergy):
    """A user's network wrapped as the docs advise: ``E(x) = ±net(x).squeeze(-1)``."""

    def __init__(self, net: nn.Module, negate: bool = False) -> None:
        super().__init__(net, negate=negate)


def autograd_functions(energy: ebmcore.EnergyModel) -> EnergyFunctions:
    return EnergyFunctions(energy.compute_energy, energy.compute_gradient, energy.compute_energy_and_gradient)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=repr)
@pytest.mark.parametrize("negate", [False, True])
def test_closed_form_equals_autograd(activation, negate):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 16), activation, nn.Linear(16, 8), activation, nn.Linear(8, 1)).double()
    energy = Wrapped(net, negate)
    x = 3 * torch.randn(300, 3, dtype=torch.float64)  # wide enough to reach every branch of relu/elu/softplus
    fns = energy.bind(x)
    assert fns.path.startswith("closed-form gradient of a feed-forward network 3-16-8-1")
    e, g = fns.energy_and_gradient(x)
    e_ref, g_ref = energy.compute_energy_and_gradient(x)
    torch.testing.assert_close(e, e_ref, rtol=0, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    # a gradient checked against finite differences too, not only against autograd
    h = 1e-6
    fd = (
        energy.compute_energy(x + h * torch.eye(3, dtype=x.dtype)[0])
        - energy.compute_energy(x - h * torch.eye(3, dtype=x.dtype)[0])
    ) / (2 * h)
    if not isinstance(activation, (nn.ReLU, nn.LeakyReLU, nn.ELU)):  # kinks: finite differences straddle them
        torch.testing.assert_close(g[:, 0], fd, rtol=1e-5, atol=1e-6)


def test_mlp_energy_and_single_layer_and_float32():
    mlp = ebmcore.MLPEnergy(2, (64, 64), seed=3)
    x = torch.randn(1000, 2)
    fns = mlp.bind(x)
    assert fns.path == "closed-form gradient of a feed-forward network 2-64-64-1 (silu)"
    e, g = fns.energy_and_gradient(x)
    e_ref, g_ref = mlp.compute_energy_and_gradient(x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref)
    unbiased = Wrapped(nn.Sequential(nn.Linear(2, 8, bias=False), nn.Tanh(), nn.Linear(8, 1, bias=False)))
    e, g = unbiased.bind(x).energy_and_gradient(x)
    torch.testing.assert_close(g, unbiased.compute_energy_and_gradient(x)[1])
    linear = ebmcore.MLPEnergy(4, (), seed=1)  # no hidden layer: E = w·x + b, ∇E = w
    x4 = torch.randn(5, 4)
    e, g = linear.bind(x4).energy_and_gradient(x4)
    torch.testing.assert_close(g, linear.net[0].weight.expand(5, 4))


def test_results_are_fresh_and_follow_weight_updates_and_batch_sizes():
    mlp = ebmcore.MLPEnergy(2, (8,), seed=0)
    x = torch.randn(50, 2)
    fns = mlp.bind(x)
    e1, g1 = fns.energy_and_gradient(x)
    kept_e, kept_g = e1.clone(), g1.clone()
    fns.energy_and_gradient(x + 1.0)  # a second call must not overwrite what the first returned (MALA keeps both)
    torch.testing.assert_close(e1, kept_e, rtol=0, atol=0)
    torch.testing.assert_close(g1, kept_g, rtol=0, atol=0)
    with torch.no_grad():
        mlp.net[0].weight.mul_(2.0)  # a training step: the bound plan reads the modules' current weights
    torch.testing.assert_close(fns.energy_and_gradient(x)[1], mlp.compute_energy_and_gradient(x)[1])
    small = x[:7]
    torch.testing.assert_close(fns.energy_and_gradient(small)[1], mlp.compute_energy_and_gradient(small)[1])


class Flag(ebmcore.EnergyModel):
    """A hand-written compute_energy: ebm does not read it (autograd), whatever its flags."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
        self.negate = False

    def compute_energy(self, x):
        e = self.net(x).squeeze(-1)
        return -e if self.negate else e


class Mixed(Wrapped):
    def compute_energy(self, x):
        return self.net(x).squeeze(-1) + 0.5 * (x**2).sum(-1)


def test_hand_written_and_other_models_keep_autograd_with_the_reason():
    x = torch.randn(20, 2)
    flag = Flag()
    fns = flag.bind(x)
    assert fns.path == (
        "autograd (Flag.compute_energy is Python code that ebm does not read; wrap an nn.Sequential in "
        "ebmcore.SequentialEnergy (or use MLPEnergy) for the closed form and kernels)"
    )
    flag.negate = True
    torch.testing.assert_close(flag.bind(x).energy_and_gradient(x)[1], flag.compute_energy_and_gradient(x)[1])
    assert (
        Mixed(nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))).bind(x).path
        == "autograd (Mixed overrides compute_energy, which ebm does not read)"
    )
    scaled = Wrapped(nn.Sequential(nn.Linear(2, 4), nn.Softsign(), nn.Linear(4, 1)))
    assert scaled.bind(x).path == "autograd (layer 1: module Softsign has no closed-form derivative here)"


def test_the_program_follows_the_structure_and_never_runs_compute_energy(monkeypatch):
    from ebmcore.energies.program import Activation, ActivationKind, FeedForward, Opaque

    x = torch.randn(20, 2, dtype=torch.float64)
    energy = Wrapped(nn.Sequential(nn.Linear(2, 4), nn.Softplus(), nn.Linear(4, 1)).double())

    def check(path_start):  # the bound gradient is autograd's, whatever changed
        fns = energy.bind(x)
        assert fns.path.startswith(path_start), fns.path
        torch.testing.assert_close(fns.energy_and_gradient(x)[1], energy.compute_energy_and_gradient(x)[1])

    first = energy.program()
    assert isinstance(first, FeedForward) and first == energy.program()  # equal values: a cache may key on it
    assert first.layers[0].activation == Activation(ActivationKind.SOFTPLUS, (1.0, 20.0))
    with torch.no_grad():
        energy.net[0].weight.mul_(1.5)  # an optimizer step: same program, the closed form reads the new weights
    assert energy.program() == first
    check("closed-form gradient of a feed-forward network 2-4-1 (softplus(beta=1, threshold=20))")
    energy.net[1].beta = 2.0  # a setting changed in place: a new program
    assert energy.program() != first and energy.program().layers[0].activation.params == (2.0, 20.0)
    check("closed-form gradient of a feed-forward network 2-4-1 (softplus(beta=2, threshold=20))")
    energy.negate = True
    assert energy.program().sign == -1.0
    check("closed-form")
    energy.net[1] = nn.Tanh()  # a module replaced
    check("closed-form gradient of a feed-forward network 2-4-1 (tanh)")
    handle = energy.net[2].register_forward_hook(lambda module, args, out: 2 * out)
    assert energy.program() == Opaque("module Linear has forward hooks")
    check("autograd (module Linear has forward hooks)")
    handle.remove()
    check("closed-form")
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: out)
    try:
        check("autograd (global forward hooks are registered")
    finally:
        handle.remove()

    def refuse(self, x):
        raise AssertionError("program() and bind() must not run compute_energy")

    monkeypatch.setattr(ebmcore.SequentialEnergy, "compute_energy", refuse)
    assert isinstance(energy.program(), FeedForward)
    energy.bind(x).energy_and_gradient(x)


ACT = torch.tanh  # rebound by the test below: a global that compute_energy reads


class DictBranch(ebmcore.EnergyModel):
    def __init__(self):
        super().__init__()
        self.event_shape = (2,)
        self.cfg = {"act": "tanh"}
        self.l1, self.l2 = nn.Linear(2, 16), nn.Linear(16, 1)

    def compute_energy(self, x):
        h = self.l1(x)
        h = torch.tanh(h) if self.cfg["act"] == "tanh" else torch.relu(h)
        return self.l2(h).squeeze(-1)


class GlobalActivation(DictBranch):
    def compute_energy(self, x):
        return self.l2(ACT(self.l1(x))).squeeze(-1)


class SideEffects(DictBranch):
    def __init__(self):
        super().__init__()
        self.seen, self.n = [], 0

    def compute_energy(self, x):
        self.seen.append(x.shape[0])
        self.n += x.shape[0]
        return self.l2(torch.tanh(self.l1(x))).squeeze(-1)


def _every_path_gradient_is_autograds(energy, x):
    """The sampler's bound gradient, and ULA's chain, against autograd's at the model as it is now."""
    from ebm_samplers import LangevinSampler, MALASampler

    torch.testing.assert_close(energy.bind(x).gradient(x), energy.compute_gradient(x), rtol=0, atol=0)
    for sampler in (LangevinSampler(energy, step_size=0.01), MALASampler(energy, step_size=0.01)):
        assert "autograd" in sampler.prepare(x, None, {}).path
    g = torch.Generator().manual_seed(0)
    got = LangevinSampler(energy, step_size=0.01).sample(x, 3, generator=g)
    expected = x
    g = torch.Generator().manual_seed(0)
    noise = torch.empty_like(x)
    for _ in range(3):  # ULA's per-step loop: ξ drawn like x from the generator, then the step
        noise.normal_(generator=g)
        expected = expected - 0.01 * energy.compute_gradient(expected) + 0.02**0.5 * noise
    torch.testing.assert_close(got, expected)


def test_a_branch_on_a_dict_changed_in_place_is_seen():
    """Issue 25, reproduction 1: a branch on a dict attribute changed in place after a first run."""
    torch.manual_seed(0)
    m, x = DictBranch(), torch.randn(64, 2)
    _every_path_gradient_is_autograds(m, x)
    m.cfg["act"] = "relu"
    _every_path_gradient_is_autograds(m, x)


def test_a_rebound_global_is_seen():
    """Issue 25, reproduction 2: compute_energy reads a module-level global that is rebound."""
    global ACT
    torch.manual_seed(0)
    m, x = GlobalActivation(), torch.randn(64, 2)
    _every_path_gradient_is_autograds(m, x)
    ACT = torch.sigmoid
    try:
        _every_path_gradient_is_autograds(m, x)
    finally:
        ACT = torch.tanh


def test_a_models_side_effects_see_real_tensors_only():
    """Issue 25, reproduction 3: compute_energy's own state sees only the calls the sampler makes, with real sizes."""
    from ebm_samplers import LangevinSampler

    m, x = SideEffects(), torch.randn(64, 2)
    LangevinSampler(m, step_size=0.01).sample(x, 3)
    assert m.seen and all(type(n) is int and n == 64 for n in m.seen)
    assert type(m.n) is int and m.n == 64 * len(m.seen)
    assert f"{m.n:d}" == str(m.n)  # the user's own code still formats it


def test_the_program_does_not_keep_a_model_alive():
    import gc
    import weakref

    energy = Wrapped(nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1)))
    assert energy.bind(torch.randn(5, 2)).path.startswith("closed-form")
    alive = weakref.ref(energy)
    del energy
    gc.collect()
    assert alive() is None


def test_autocast_steps_aside():
    mlp = ebmcore.MLPEnergy(2, (16,), seed=0)
    x = torch.randn(10, 2)
    fns = mlp.bind(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e, g = fns.energy_and_gradient(x)
        e_ref, g_ref = mlp.compute_energy_and_gradient(x)
    assert e.dtype == e_ref.dtype and torch.equal(g, g_ref)  # autograd under autocast, as without the plan


def test_a_sampler_run_is_unchanged_by_the_closed_form():
    from ebm_samplers import MALASampler  # a sampler that keeps the current gradient while evaluating the proposal

    class Reference(Wrapped):
        def bind(self, like):
            return autograd_functions(self)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 32), nn.SiLU(), nn.Linear(32, 1))
    x0 = torch.randn(256, 2)
    fast, slow = MALASampler(Wrapped(net), step_size=0.1), MALASampler(Reference(net), step_size=0.1)
    assert "closed-form" in fast.prepare(x0, None, {}).path
    a = fast.sample(x0, 30, generator=torch.Generator().manual_seed(5))
    b = slow.sample(x0, 30, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


class _Triple(nn.Module):
    def forward(self, w):
        return 3 * w


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda net: net[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,)), "module Linear has backward hooks"),
        (lambda net: net[1].register_full_backward_pre_hook(lambda m, go: (go[0] * 3,)), "module Tanh has backward hooks"),
        (
            lambda net: nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None),
            "global backward hooks are registered",
        ),
        (lambda net: nn.utils.parametrize.register_parametrization(net[0], "weight", _Triple()), "is parametrized"),
    ],
    ids=["backward hook", "backward pre-hook", "global backward hook", "parametrization"],
)
def test_a_hook_or_parametrization_added_after_construction_keeps_autograd(change, reason):
    from ebm_samplers import MALASampler

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    energy, x = ebmcore.SequentialEnergy(net), torch.randn(5, 2)
    assert energy.bind(x).path.startswith("closed-form")
    handle = change(net)  # registered after the energy was built: seen at the next bind
    try:
        xg = x.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(energy.compute_energy(xg).sum(), xg)  # autograd, with the hook
        fns = energy.bind(x)
        assert fns.path.startswith("autograd (") and reason in fns.path, fns.path
        torch.testing.assert_close(fns.gradient(x), expected)
        assert reason in MALASampler(energy, step_size=0.1).prepare(x, None, {}).path
    finally:
        if hasattr(handle, "remove"):
            handle.remove()


def test_why_not_names_the_reason():
    assert feedforward.why_not(ebmcore.MLPEnergy(2, (4,), seed=0).program(), torch.randn(3, 2)) == ""
    assert "first layer" in feedforward.why_not(ebmcore.MLPEnergy(2, (4,), seed=0).program(), torch.randn(3, 5))
    assert "floating (n, d)" in feedforward.why_not(ebmcore.MLPEnergy(2, (4,), seed=0).program(), torch.randn(3, 2, 1))


def test_contrastive_divergence_one_pass_equals_two():
    from ebm_losses import ContrastiveDivergence

    class Separate(Wrapped):  # a model the plan does not recognise: CD evaluates each batch on its own
        def compute_energy(self, x):
            return self.net(x).squeeze(-1) + 0.0 * x.sum(-1)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.SiLU(), nn.Linear(16, 1)).double()
    data = torch.randn(128, 2, dtype=torch.float64)
    losses, grads = [], []
    for energy in (Wrapped(net), Separate(net)):
        loss = ContrastiveDivergence("langevin", 5, sampler_options={"step_size": 0.01}, regularization=0.1)
        value = loss(energy, data, generator=torch.Generator().manual_seed(1))
        net.zero_grad()
        value.backward()
        losses.append(value.detach())
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def test_a_bound_model_still_pickles_and_copies():
    import copy
    import io

    mlp = ebmcore.MLPEnergy(2, (8,), seed=0)
    x = torch.randn(6, 2)
    assert mlp.bind(x).path.startswith("closed-form")
    buffer = io.BytesIO()
    torch.save(mlp, buffer)  # the program is not part of the model
    twin = copy.deepcopy(mlp)
    with torch.no_grad():
        twin.net[0].weight.add_(1.0)  # the copy's plan must use the copy's weights
    torch.testing.assert_close(twin.bind(x).energy_and_gradient(x)[1], twin.compute_energy_and_gradient(x)[1])


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=repr)
def test_score_terms_equal_nested_autograd(activation):
    """∇ₓE and vᵀ∇²E v by the chain rule, and the parameter gradient of a loss of them, against autograd."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 16), activation, nn.Linear(16, 8), activation, nn.Linear(8, 1)).double()
    energy = Wrapped(net, negate=True)
    x, v = 2 * torch.randn(64, 3, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64)
    plan, _ = closed_form_program(energy, x)

    def loss_of(grad, vhv):
        return (0.5 * (grad * v).sum(-1) ** 2 - vhv).mean()

    grad, vhv = feedforward.score_terms(plan, x, v)
    params = list(net.parameters())
    fast = torch.autograd.grad(loss_of(grad, vhv), params, allow_unused=True, materialize_grads=True)
    xg = x.clone().requires_grad_(True)
    grad_ref = energy.compute_gradient(xg, create_graph=True)
    (hv,) = torch.autograd.grad((grad_ref * v).sum(), xg, create_graph=True)
    vhv_ref = (hv * v).sum(-1)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vhv, vhv_ref, rtol=1e-9, atol=1e-10)
    slow = torch.autograd.grad(loss_of(grad_ref, vhv_ref), params, allow_unused=True, materialize_grads=True)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(
    "make_loss",
    [
        lambda L: L.SlicedScoreMatching(2, projection="gaussian"),
        lambda L: L.SlicedScoreMatching(1, variance_reduction=True),
        lambda L: L.DenoisingScoreMatching(0.1),
        lambda L: L.DenoisingScoreMatching(sigmas=[0.05, 0.5]),
    ],
    ids=["ssm", "ssm-vr", "dsm", "dsm-levels"],
)
def test_score_matching_losses_take_the_closed_form_with_the_same_result(make_loss):
    import ebm_losses

    class Opaque(Wrapped):  # not a plain chain: the losses use nested autograd
        def compute_energy(self, x):
            return self.net(x).squeeze(-1) + 0.0 * x[:, 0]

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.SiLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    data = torch.randn(256, 2, dtype=torch.float64)
    loss = make_loss(ebm_losses)
    results = []
    for energy in (Wrapped(net), Opaque(net)):
        value = loss(energy, data, generator=torch.Generator().manual_seed(3))
        grads = torch.autograd.grad(value, list(net.parameters()), allow_unused=True, materialize_grads=True)
        results.append((value.detach(), torch.cat([g.flatten() for g in grads])))
    assert closed_form_program(Wrapped(net), data)[0] is not None and closed_form_program(Opaque(net), data)[0] is None
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-9, atol=1e-11)


def test_check_program_holds_a_declared_program_to_compute_energy():
    from ebm_losses import ConvEnergy
    from ebmcore.energies.program import feedforward_of
    from ebmcore.testing import check_program

    check_program(ebmcore.MLPEnergy(2, (8, 8), seed=0), torch.randn(10, 2))
    check_program(ConvEnergy((1, 8, 8), (4, 8), activation="tanh", seed=0), torch.randn(5, 1, 8, 8))
    net = nn.Sequential(nn.Linear(3, 5), nn.Softplus(beta=2.0), nn.Linear(5, 1))
    check_program(ebmcore.SequentialEnergy(net, negate=True), torch.randn(6, 3))

    class Liar(ebmcore.SequentialEnergy):  # declares the network without its sign
        def program(self):
            return feedforward_of(self.net, 1.0)

    with pytest.raises(AssertionError, match="energy of feed-forward network 3-5-1"):
        check_program(Liar(net, negate=True), torch.randn(6, 3))


def test_a_layer_in_another_dtype_is_named_with_the_fix():
    """Issue 29: a network whose last Linear is float64 and the rest float32 cannot run on any path: the sampler says
    which layer and the fix; the checked entry points (the sampler's check of x0 among them) name it by its parameter
    before any path runs, for a hand-written compute_energy too (issue 40: tests/test_entry_point_errors.py)."""
    from ebm_samplers import MALASampler

    net = nn.Sequential(nn.Linear(2, 8), nn.SiLU(), nn.Linear(8, 1))
    net[2].double()
    mixed = Wrapped(net)
    message = (
        r"Linear layer 1 of the network \(Linear\(in_features=8, out_features=1, bias=True\)\) holds torch\.float64 "
        r"weights on cpu but the first layer holds torch\.float32 on cpu; .*model\.to\(torch\.float32\)"
    )
    with pytest.raises(ebmcore.InputError, match=message):
        feedforward.why_not(mixed.program(), torch.randn(5, 2))
    with pytest.raises(
        ebmcore.InputError,
        match=r"layer 'net\.2' \(Linear\) holds parameter 'net\.2\.weight' in "
        r"torch\.float64 on cpu, but 'net\.0\.weight' is torch\.float32 on cpu; "
        r".*model\.to\(torch\.float32\)",
    ):
        MALASampler(mixed).sample(torch.randn(5, 2), 2)
