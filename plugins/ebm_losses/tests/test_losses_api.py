"""Registration, contracts, samplers by name/instance/factory, the replay buffer, clipping, datasets."""

import pytest
import torch

import ebmcore
from ebm_losses import ClippedGradientEnergy, ContrastiveDivergence, PersistentContrastiveDivergence, datasets
from ebm_samplers import LangevinSampler
from ebmcore.errors import InputError
from ebmcore.testing import check_loss

NAMES = [
    "contrastive_divergence",
    "persistent_contrastive_divergence",
    "score_matching",
    "sliced_score_matching",
    "denoising_score_matching",
    "nce",
    "energy_matching",
    "equilibrium_matching",
]


@pytest.mark.parametrize("name", NAMES)
def test_registered_losses_pass_the_core_contract(name):
    entry = ebmcore.registry.get("loss", name)
    assert entry.distribution == "ebm-losses"
    check_loss(entry.component)


def test_cd_takes_a_sampler_by_name_instance_or_factory():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    data = torch.randn(16, 2)
    by_name = ContrastiveDivergence("langevin", 5, sampler_options={"step_size": 0.01})
    instance = LangevinSampler(energy, step_size=0.01)
    by_instance = ContrastiveDivergence(instance, 5)
    by_factory = ContrastiveDivergence(lambda e: LangevinSampler(e, step_size=0.01), 5)
    values = [loss(energy, data, generator=torch.Generator().manual_seed(0)) for loss in (by_name, by_instance, by_factory)]
    assert values[0] == values[1] == values[2]
    assert by_instance.sampler_for(energy) is instance
    # a built sampler is kept for its energy (identity, not id(): a new energy gets its own)
    assert by_name.sampler_for(energy) is by_name.sampler_for(energy) and by_name.sampler_for(energy).energy is energy
    other = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=1)
    assert by_name.sampler_for(other).energy is other
    with pytest.raises(ebmcore.UnknownComponentError, match="(?s)no sampler named 'langevn'.*Did you mean 'langevin'"):
        ContrastiveDivergence("langevn")(energy, data)


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "per-step"])
def test_cd_prepares_its_sampler_once_per_call_and_draws_what_advance_draws(fused, monkeypatch):
    """One ``prepare`` per CD call (the plan of the sampler's run, which the contrastive chain or the loop then
    executes; with fused=False it prepared twice), and the negatives are ``advance``'s to the bit."""
    from ebm_samplers.sampler import AlgorithmSampler

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    data = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    loss = ContrastiveDivergence("langevin", 5, sampler_options={"step_size": 0.01, "fused": fused})
    prepared, real = [], AlgorithmSampler.prepare
    monkeypatch.setattr(AlgorithmSampler, "prepare", lambda self, *a, **k: prepared.append(1) or real(self, *a, **k))
    loss(energy, data, generator=torch.Generator().manual_seed(0))
    assert len(prepared) == 1
    assert torch.equal(loss.last_negatives, loss.sampler_for(energy).advance(data, 5, generator=torch.Generator().manual_seed(0)))


def test_persistent_cd_keeps_and_restarts_its_buffer():
    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    loss = PersistentContrastiveDivergence(
        "langevin", 3, sampler_options={"step_size": 0.01}, buffer_size=500, reinit_fraction=0.2
    )
    data = datasets.make("two_moons", 200, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    loss(energy, data, generator=g)
    state = loss.state_dict()
    assert state["buffer"].shape == (500, 2)
    low, high = data.min(0).values, data.max(0).values
    assert bool(((state["buffer"] >= low - 0.2 * (high - low)) & (state["buffer"] <= high + 0.2 * (high - low))).all())
    before = state["buffer"].clone()
    loss(energy, data, generator=g)
    changed = (loss.buffer != before).any(1).sum()
    assert 100 <= changed <= 200  # 200 draws with replacement from 500 slots, all rewritten
    fresh = PersistentContrastiveDivergence("langevin", 3, sampler_options={"step_size": 0.01}, buffer_size=500)
    fresh.load_state_dict(loss.state_dict())
    assert torch.equal(fresh.buffer, loss.buffer)


def test_gradient_clipping_clamps_what_the_sampler_sees_and_never_owns_the_model():
    energy = ebmcore.DoubleWellEnergy(dim=2)
    clipped = ClippedGradientEnergy(energy, 0.5)
    x = torch.full((4, 2), 3.0)
    assert clipped.gradient(x).abs().max() == 0.5 and energy.gradient(x).abs().max() > 50
    fns = clipped.bind(x)
    assert fns.gradient(x).abs().max() == 0.5 and fns.energy_and_gradient(x)[1].abs().max() == 0.5
    assert list(clipped.children()) == []


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ContrastiveDivergence(n_steps=0), "n_steps must be a positive integer"),
        (lambda: ContrastiveDivergence(regularization=-1), "regularization must be a finite number >= 0"),
        (lambda: ContrastiveDivergence(sampler=3), "sampler must be a registered name"),
        (lambda: ContrastiveDivergence(gradient_clip=0), "gradient_clip must be a finite positive number"),
        (lambda: PersistentContrastiveDivergence(reinit_fraction=2), r"reinit_fraction must be in \[0, 1\]"),
        (lambda: PersistentContrastiveDivergence(noise="pink"), "noise must be 'uniform', 'gaussian' or a callable"),
    ],
)
def test_bad_loss_parameters(build, message):
    with pytest.raises(InputError, match=message):
        build()


@pytest.mark.parametrize("name", sorted(datasets.DATASETS))
def test_toy_datasets_are_seeded_locally(name):
    state = torch.get_rng_state()
    a = datasets.make(name, 500, generator=torch.Generator().manual_seed(3))
    b = datasets.make(name, 500, generator=torch.Generator().manual_seed(3))
    c = datasets.make(name, 500, generator=torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), state)
    assert a.shape == (500, 2) and a.dtype == torch.float32 and torch.equal(a, b) and not torch.equal(a, c)
    assert a.abs().max() < 6


def test_toy_dataset_geometry():
    g = torch.Generator().manual_seed(0)
    x = datasets.make_eight_gaussians(4000, generator=g, std=0.01)
    assert torch.allclose(x.norm(dim=1), torch.full((4000,), 2.0), atol=0.05)
    r = datasets.make_circles(4000, generator=g, noise=0.0).norm(dim=1)
    assert bool(((r - 1.0).abs() < 1e-5).logical_or((r - 2.5).abs() < 1e-5).all())
    board = datasets.make_checkerboard(4000, generator=g)
    cells = (torch.floor(board[:, 0] / 2) + torch.floor(board[:, 1] / 2)) % 2
    assert bool((cells == 0).all())  # only black squares
    with pytest.raises(InputError, match="unknown dataset 'moons'"):
        datasets.make("moons", 10)


class _Net(ebmcore.EnergyModel):
    """A network whose last layer gives ``(n, 1)``, or whose output is summed over the batch (``scalar``)."""

    event_shape = (2,)

    def __init__(self, output):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.output = output

    def compute_energy(self, x, sigma=None):
        e = self.layer(x).square()
        return e.sum() if self.output == "scalar" else e


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("output, shape", [("(n, 1)", r"\(16, 1\)"), ("scalar", r"\(\)")])
def test_every_loss_refuses_an_energy_that_is_not_one_value_per_row(name, output, shape):
    # score matching sees only the gradient, which for a summed energy is silently that of the sum: checked too
    loss = ebmcore.registry.get("loss", name)()
    with pytest.raises(InputError, match=rf"returned shape {shape} .*\.squeeze\(-1\)"):
        loss(_Net(output), torch.randn(16, 2), generator=torch.Generator().manual_seed(0))


def test_the_losses_fused_ops_are_defined_once_and_every_kernel_takes_their_parameters():
    from ebm_losses.network_kernels import network_kernel
    from ebm_losses.ops import LOSS_OPS
    from ebmcore import Kernel, KernelBackend, hookimpl
    from ebmcore.errors import PluginError
    from ebmcore.testing import isolated_plugins

    assert LOSS_OPS["feedforward_energy_gradients"].signature.startswith(
        "(x: Tensor, a: Tensor, b: Optional[Tensor], network: FeedForward) -> tuple[Tensor, list[Tensor]"
    )
    backends = {e.component.name: e.component for e in ebmcore.plugins.session().table.entries("kernel")}
    implemented = [(name, op) for name, backend in backends.items() for op in backend.kernels if op in LOSS_OPS]
    for name, op in implemented:
        assert LOSS_OPS[op].conformance(backends[name].kernels[op].fn) is None, (name, op)
    if "cpu_fused" in backends:  # ebm-cuda's host build implements all four
        assert sorted(op for name, op in implemented if name == "cpu_fused") == sorted(LOSS_OPS)

    def wrong(x, a, network):  # forgot b
        raise AssertionError("never called")

    class Wrong:
        @hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                KernelBackend("wrong", [Kernel("feedforward_energy_gradients", wrong, ("cpu",), priority=50)])
            )

    energy = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    from ebm_losses import plugin as losses_plugin  # defines the op (ebm_register_ops)

    with isolated_plugins(("losses", losses_plugin), ("wrong", Wrong())):
        with pytest.raises(
            PluginError,
            match=r"op 'feedforward_energy_gradients' \(.*wrong\) does not take the op's "
            r"parameters \(x: Tensor, a: Tensor, b: Optional\[Tensor\], network",
        ):
            network_kernel("feedforward_energy_gradients", energy.program(), torch.randn(4, 2))
