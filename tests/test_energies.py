"""Builtin energies: closed forms, gradients against autograd and finite differences, strict input checks."""

import math

import pytest
import torch

import ebmcore
from ebmcore.errors import InputError, NonFiniteError
from ebmcore.testing import check_energy

G = torch.Generator().manual_seed(1234)


def _spd(d, dtype=torch.float64):
    a = torch.randn(d, d, generator=G, dtype=dtype)
    return a @ a.T / d + 0.5 * torch.eye(d, dtype=dtype)


BUILDERS = {
    "gaussian": lambda: ebmcore.energy("gaussian", mean=torch.randn(4, generator=G, dtype=torch.float64), covariance=_spd(4)),
    "gaussian_mixture": lambda: ebmcore.energy(
        "gaussian_mixture",
        means=torch.randn(3, 4, generator=G, dtype=torch.float64) * 2,
        stds=torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64),
        weights=[1.0, 2.0, 3.0],
    ),
    "double_well": lambda: ebmcore.energy("double_well", dim=4, barrier=2.0),
    "rosenbrock": lambda: ebmcore.energy("rosenbrock", dim=4),
    "harmonic": lambda: ebmcore.energy("harmonic", dim=4, stiffness=3.0, center=[1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
    "ackley": lambda: ebmcore.energy("ackley", dim=4),
    "rastrigin": lambda: ebmcore.energy("rastrigin", dim=4),
    "mlp": lambda: ebmcore.energy("mlp", dim=4, hidden=(16, 16), seed=0, dtype=torch.float64),
}


def test_every_registered_energy_is_covered():
    """Every energy of the core; a plugin's are its own tests' (ebm-losses' conv: plugins/ebm_losses/tests)."""
    core = {n for n in ebmcore.registry.names("energy") if ebmcore.registry.get("energy", n).distribution == "ebmcore"}
    assert set(BUILDERS) == core


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_gradient_matches_autograd_and_finite_differences_in_float64(name):
    energy = BUILDERS[name]()
    x = torch.randn(32, 4, generator=G, dtype=torch.float64)
    check_energy(energy, x)


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_and_device_are_preserved(name, dtype):
    energy = BUILDERS[name]().to(dtype)
    x = torch.randn(8, 4, generator=G).to(dtype)
    e, g = energy.energy_and_gradient(x)
    assert (e.shape, e.dtype, e.device) == ((8,), dtype, x.device)
    assert (g.shape, g.dtype, g.device) == (x.shape, dtype, x.device)
    assert torch.equal(energy.score(x), -energy.gradient(x))


def test_parameter_free_energies_take_half_precision():
    x = torch.randn(8, 2, generator=G)
    for name in ["double_well", "rosenbrock", "ackley", "rastrigin"]:
        energy = ebmcore.energy(name, dim=2)
        for dtype in (torch.float16, torch.bfloat16):
            e = energy.energy(x.to(dtype))
            assert e.dtype == dtype
            torch.testing.assert_close(e.float(), energy.energy(x), rtol=5e-2, atol=5e-2)


def test_gaussian_closed_form_and_parameterisations_agree():
    mean, cov = torch.randn(5, generator=G, dtype=torch.float64), _spd(5)
    by_cov = ebmcore.GaussianEnergy(mean, covariance=cov)
    by_prec = ebmcore.GaussianEnergy(mean, precision=torch.linalg.inv(cov))
    x = torch.randn(10, 5, generator=G, dtype=torch.float64)
    diff = x - mean
    expected = 0.5 * (diff * torch.linalg.solve(cov, diff.T).T).sum(-1)
    torch.testing.assert_close(by_cov.energy(x), expected)
    torch.testing.assert_close(by_prec.energy(x), expected)
    torch.testing.assert_close(by_cov.gradient(x), torch.linalg.solve(cov, diff.T).T)
    assert by_cov.energy(mean[None]).item() == pytest.approx(0.0, abs=1e-12)
    standard = ebmcore.GaussianEnergy(dim=3)
    torch.testing.assert_close(standard.energy(torch.ones(1, 3)), torch.tensor([1.5]))


def test_gaussian_mixture_is_a_normalised_density():
    energy = ebmcore.GaussianMixtureEnergy(
        means=[[-2.0, 0.0], [2.0, 1.0]], stds=[0.6, 1.0], weights=[1.0, 3.0], dtype=torch.float64
    )
    grid = torch.linspace(-9, 9, 601, dtype=torch.float64)
    xx, yy = torch.meshgrid(grid, grid, indexing="ij")
    density = torch.exp(-energy.energy(torch.stack([xx.flatten(), yy.flatten()], -1))).reshape(601, 601)
    mass = torch.trapezoid(torch.trapezoid(density, grid), grid)
    assert float(mass) == pytest.approx(1.0, abs=1e-6)
    one = ebmcore.GaussianMixtureEnergy(means=[[1.0, -1.0]], stds=0.5, dtype=torch.float64)
    x = torch.randn(6, 2, generator=G, dtype=torch.float64)
    expected = (
        0.5 * ((x - torch.tensor([1.0, -1.0], dtype=torch.float64)) ** 2).sum(-1) / 0.25
        + 2 * math.log(0.5)
        + math.log(2 * math.pi)
    )
    torch.testing.assert_close(one.energy(x), expected)


def test_landscape_minima():
    zero = torch.zeros(1, 3, dtype=torch.float64)
    assert ebmcore.energy("double_well", dim=3).energy(torch.tensor([[1.0, -1.0, 1.0]])).item() == 0.0
    assert ebmcore.energy("rosenbrock", dim=3).energy(torch.ones(1, 3)).item() == 0.0
    assert ebmcore.energy("ackley", dim=3).energy(zero).item() == pytest.approx(0.0, abs=1e-12)
    assert ebmcore.energy("rastrigin", dim=3).energy(zero).item() == 0.0
    assert ebmcore.energy("harmonic", dim=3, center=[1.0, 2.0, 3.0]).energy(torch.tensor([[1.0, 2.0, 3.0]])).item() == 0.0
    # the Ackley gradient at its non-differentiable minimum is the zero subgradient, not NaN
    assert torch.equal(ebmcore.energy("ackley", dim=3).gradient(zero), torch.zeros_like(zero))


def test_create_graph_gives_a_differentiable_gradient():
    gaussian = ebmcore.GaussianEnergy(covariance=_spd(3))
    x = torch.randn(4, 3, generator=G, dtype=torch.float64, requires_grad=True)
    grad = gaussian.gradient(x, create_graph=True)
    (hess_diag_0,) = torch.autograd.grad(grad[:, 0].sum(), x)
    torch.testing.assert_close(hess_diag_0[:, 0], gaussian.precision[0, 0].expand(4))
    mlp = ebmcore.MLPEnergy(dim=2, hidden=(8,), seed=0)
    penalty = mlp.gradient(torch.randn(16, 2, generator=G), create_graph=True).pow(2).sum()
    penalty.backward()
    weights = [p for name, p in mlp.named_parameters() if name.endswith("weight")]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in weights)  # the output bias cannot affect ∇ₓE


def test_mlp_is_seeded_locally_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b = ebmcore.MLPEnergy(seed=3), ebmcore.MLPEnergy(seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(ebmcore.MLPEnergy(seed=4).parameters()), next(a.parameters()))


# --- bad input: one clear error each ------------------------------------------------------------


def test_wrong_shape_names_the_expected_shape_and_the_fix():
    energy = ebmcore.energy("gaussian", dim=3)
    with pytest.raises(InputError, match=r"must have shape \(n, 3\).*got \(3,\).*unsqueeze\(0\)"):
        energy.energy(torch.zeros(3))
    with pytest.raises(InputError, match=r"got \(2, 5, 3\).*reshape\(-1, 3\)"):
        energy.energy(torch.zeros(2, 5, 3))
    with pytest.raises(InputError, match=r"got \(4, 2\)"):
        energy.gradient(torch.zeros(4, 2))


def test_wrong_dtype_is_an_error_not_a_silent_cast():
    energy = ebmcore.energy("gaussian", dim=2)  # float32 parameters
    with pytest.raises(InputError, match=r"float64 but GaussianEnergy holds torch.float32.*never casts silently"):
        energy.energy(torch.zeros(1, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="needs floating point"):
        energy.energy(torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        energy.energy([[0.0, 0.0]])


def test_wrong_device_is_an_error():
    energy = ebmcore.energy("harmonic", dim=2)
    with pytest.raises(InputError, match="x is on cpu but HarmonicEnergy is on meta"):
        energy.to("meta").energy(torch.zeros(1, 2))
    with pytest.raises(InputError, match="x is on the meta device, which holds shapes but no values"):
        ebmcore.energy("double_well", dim=2).energy(torch.zeros(1, 2, device="meta"))  # no parameters to compare


def test_non_finite_energy_names_the_rows():
    energy = ebmcore.energy("double_well", dim=2)
    x = torch.zeros(5, 2)
    x[3, 1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"1 of 5 rows, first at rows \[3\].*inputs themselves are non-finite"):
        energy.energy(x)
    huge = torch.full((2, 2), 1e200, dtype=torch.float64)
    with pytest.raises(NonFiniteError, match="inputs there are finite"):
        ebmcore.energy("rosenbrock", dim=2).energy(huge)


class _Net(ebmcore.EnergyModel):
    """A network whose last layer gives ``(n, 1)``, or ``(n, 2)``, or whose output is summed over the batch."""

    def __init__(self, output):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2 if output == "(n, 2)" else 1)
        self.output = output

    def compute_energy(self, x):
        e = self.layer(x).square()
        return e.sum() if self.output == "scalar" else e


@pytest.mark.parametrize(
    "output, message",
    [
        ("(n, 1)", r"returned shape \(3, 1\) for x of shape \(3, 2\); .*shape \(3,\)\. End compute_energy with \.squeeze\(-1\)"),
        ("scalar", r"returned shape \(\) .*reduced over the batch"),
        ("(n, 2)", r"returned shape \(3, 2\) .*sum the per-output terms"),
    ],
)
def test_an_energy_that_is_not_one_value_per_row_is_refused_by_the_checked_methods(output, message):
    net = _Net(output)
    for method in (net.energy, net.gradient, net.score, net.energy_and_gradient, net):
        with pytest.raises(InputError, match=message):
            method(torch.randn(3, 2))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ebmcore.GaussianEnergy(covariance=[[1.0, 2.0], [2.0, 1.0]]), "not positive definite"),
        (lambda: ebmcore.GaussianEnergy(covariance=[[1.0, 0.5], [0.0, 1.0]]), "not symmetric"),
        (lambda: ebmcore.GaussianEnergy(covariance=torch.eye(2), precision=torch.eye(2)), "not both"),
        (lambda: ebmcore.GaussianEnergy(mean=torch.zeros(3), covariance=torch.eye(2)), "inconsistent dimensions"),
        (lambda: ebmcore.GaussianEnergy(), "give dim, mean, covariance or precision"),
        (lambda: ebmcore.GaussianEnergy(mean=[float("nan"), 0.0]), "NaN or inf"),
        (lambda: ebmcore.GaussianMixtureEnergy(means=[[0.0, 0.0]], stds=-1.0), "stds must be positive"),
        (lambda: ebmcore.GaussianMixtureEnergy(means=[0.0, 0.0]), r"means must have shape \(K, d\)"),
        (lambda: ebmcore.GaussianMixtureEnergy(means=[[0.0], [1.0]], weights=[1.0, 0.0]), "positive numbers"),
        (lambda: ebmcore.DoubleWellEnergy(barrier=0.0), "barrier must be a finite positive number"),
        (lambda: ebmcore.RosenbrockEnergy(dim=1), "dim >= 2"),
        (lambda: ebmcore.HarmonicEnergy(dim=2, center=[1.0]), r"center must be 2 finite numbers, shape \(2,\); got shape \(1,\)"),
        (lambda: ebmcore.DoubleWellEnergy(dim=0), "dim must be a positive integer"),
        (lambda: ebmcore.MLPEnergy(activation="swishy"), "unknown activation 'swishy'"),
        (lambda: ebmcore.MLPEnergy(hidden=(0,)), "hidden must be positive integers"),
    ],
)
def test_bad_parameters_are_clear_errors(build, message):
    with pytest.raises(InputError, match=message):
        build()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_bind_gives_the_same_values_as_the_methods(name):
    energy = BUILDERS[name]()
    x = torch.randn(8, 4, generator=G, dtype=torch.float64)
    fns = energy.bind(x)
    torch.testing.assert_close(fns.energy(x), energy.energy(x))
    torch.testing.assert_close(fns.gradient(x), energy.gradient(x))
    e, g = fns.energy_and_gradient(x)
    torch.testing.assert_close(e, energy.energy(x))
    torch.testing.assert_close(g, energy.gradient(x))


def test_parameter_conventions():
    # one std per component, or (K, d); a per-dimension vector must be expanded explicitly
    mix = ebmcore.GaussianMixtureEnergy(means=[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], stds=[0.5, 2.0])
    assert mix.stds.tolist() == [[0.5] * 3, [2.0] * 3]
    with pytest.raises(InputError, match=r"one per component \(K,\) = \(2,\), or \(K, d\) = \(2, 3\)"):
        ebmcore.GaussianMixtureEnergy(means=[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], stds=[1.0, 1.0, 1.0])
    assert ebmcore.HarmonicEnergy(dim=2, center=[1, 2]).center.dtype == torch.get_default_dtype()
    with pytest.raises(InputError, match="dim must be a positive integer"):
        ebmcore.MLPEnergy(dim=True)


def test_public_gradient_is_detached_unless_create_graph():
    energy = ebmcore.GaussianEnergy(mean=torch.nn.Parameter(torch.zeros(2)))
    x = torch.randn(4, 2)
    assert not energy.gradient(x).requires_grad
    assert energy.gradient(x, create_graph=True).requires_grad


@pytest.mark.parametrize("name", ["gaussian", "double_well", "harmonic", "rosenbrock", "ackley", "rastrigin", "mlp"])
def test_energies_evaluate_on_the_meta_device_for_shapes_and_sampling_there_is_refused(name):
    energy = ebmcore.energy(name, dim=3).to("meta")
    x = torch.empty(5, 3, device="meta")
    e, g = energy.compute_energy_and_gradient(x)  # the unchecked methods: shapes without values
    assert (e.shape, e.device.type) == ((5,), "meta") and energy.compute_gradient(x).shape == (5, 3)
    with pytest.raises(InputError, match="x is on the meta device.*the unchecked compute_\\* methods take meta tensors"):
        energy.energy_and_gradient(x)  # the checked ones check values, which meta tensors lack
    sampler = ebmcore.registry.get("sampler", "langevin")(energy, step_size=0.1)
    with pytest.raises(InputError, match="x0 is on the meta device.*Sample on 'cpu' or 'cuda'"):
        sampler.sample(x, 3)
