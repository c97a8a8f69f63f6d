"""One declared parameter table per analytic energy drives its kernel arguments, the torch backend's
kernels, the op sample inputs and the builtin registration; a new energy is one class."""

import pytest
import torch

import ebmcore
from ebmcore import registry
from ebmcore.energies import AnalyticEnergy, Param, builtin_analytic_energies, matrix, scalar, tensor, vector
from ebmcore.energies.catalog import declares_op
from ebmcore.kernels import ops
from ebmcore.kernels.torch_backend import TorchBackend
from ebmcore.testing import check_energy, check_kernel

BUILTIN = builtin_analytic_energies()


def _instance(energy: type[AnalyticEnergy], d: int = 3) -> AnalyticEnergy:
    if energy is ebmcore.GaussianMixtureEnergy:
        return energy(means=torch.randn(2, d, dtype=torch.float64))
    if energy is ebmcore.GaussianEnergy:
        return energy(dim=d, dtype=torch.float64)
    return energy(dim=d)


def test_the_catalog_finds_every_builtin_analytic_energy_in_module_order():
    assert list(BUILTIN) == ["gaussian", "gaussian_mixture", "double_well", "rosenbrock", "harmonic", "ackley", "rastrigin"]
    assert all(energy.__module__.startswith("ebmcore.energies.") for energy in BUILTIN.values())


@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_kernel_args_are_the_declared_parameters_in_order(op):
    energy_cls = BUILTIN[op]
    energy = _instance(energy_cls)
    args = energy.kernel_args()
    assert len(args) == len(energy_cls.params) > 0
    for param, value in zip(energy_cls.params, args):
        assert value is getattr(energy, param.name)
        if param.kind == "scalar":
            assert isinstance(value, float)
        else:
            assert isinstance(value, torch.Tensor) and param.name in dict(energy.named_buffers())
            assert value.dim() == len(param.shape)
            assert all(size == energy.dim for s, size in zip(param.shape, value.shape) if s == "d")


def test_the_builtin_plugin_registers_every_catalogued_energy_under_its_op(ebm_plugins):
    provided = ebm_plugins.records["builtin"].provides["energy"]
    assert provided == [*BUILTIN, "mlp"]
    for op, energy in BUILTIN.items():
        assert registry.get("energy", op).component is energy


def test_every_registered_analytic_energy_has_its_reference_ops_and_sample_inputs(ebm_plugins):
    torch_kernels = registry.get("kernel", "torch").component.kernels
    analytic = [e.component for e in registry.entries("energy") if declares_op(e.component)]
    assert sorted(e.op for e in analytic) == sorted(BUILTIN)
    for energy in analytic:
        for kind in ("energy", "gradient"):
            op = f"{energy.op}_{kind}"
            assert torch_kernels[op].fn is getattr(energy, f"reference_{kind}")
            assert op in ops.OPS
    checked = check_kernel(
        TorchBackend(), [op for e in analytic for op in (f"{e.op}_energy", f"{e.op}_gradient")], dtypes=(torch.float32,)
    )
    assert len(checked) == 2 * len(analytic)


def test_ops_are_derived_from_the_tables():
    derived = {name for energy in BUILTIN.values() for name in ops.energy_ops(energy)}
    assert set(ops.OPS) == derived | {"langevin_step"}
    assert ops.OPS["gaussian_energy"].signature == "(x: (n, d), mean: (d,), precision: (d, d)) -> energy: (n,)"
    assert ops.OPS["rosenbrock_gradient"].signature == "(x: (n, d >= 2), a: float, b: float) -> gradient: (n, d)"
    assert ops.OPS["gaussian_mixture_energy"].signature.startswith("(x: (n, d), means: (K, d), stds: (K, d), log_weights: (K,))")
    x, mean, precision = ops.sample_inputs("gaussian_energy", n=5, d=3)
    assert x.shape == (5, 3) and mean.shape == (3,) and precision.shape == (3, 3)
    torch.linalg.cholesky(precision)  # the matrix sample is symmetric positive definite


def test_the_torch_backend_kernels_are_the_classes_references():
    kernels = TorchBackend().kernels
    assert set(kernels) == set(ops.OPS)
    from ebmcore.kernels import torch_backend

    assert torch_backend.double_well_gradient is ebmcore.DoubleWellEnergy.reference_gradient  # kept names
    with pytest.raises(AttributeError):
        torch_backend.no_such_energy


def test_a_parameter_of_the_wrong_shape_names_the_expected_shape():
    class Quadratic(AnalyticEnergy):
        op = "quadratic_form"
        params = (matrix("a"), vector("b"))

        def __init__(self, a, b):
            super().__init__(len(b))
            self.set_parameters(a=torch.as_tensor(a), b=torch.as_tensor(b))

    with pytest.raises(ebmcore.InputError, match=r"Quadratic: a must have shape \(d, d\) = \(2, 2\), got \(2, 3\)"):
        Quadratic(torch.zeros(2, 3), [0.0, 1.0])
    with pytest.raises(ebmcore.InputError, match="Quadratic: a must be a floating-point tensor of shape"):
        Quadratic(torch.zeros(2, 2, dtype=torch.int64), [0.0, 1.0])
    with pytest.raises(ebmcore.InputError, match="Quadratic: b contains NaN or inf"):
        Quadratic(torch.eye(2), [float("nan"), 1.0])


def test_sizes_other_than_d_must_agree_across_parameters():
    class Mixture(AnalyticEnergy):
        op = "toy_mixture"
        params = (tensor("means", ("K", "d"), lambda d, g: torch.zeros(2, d)), tensor("w", ("K",), lambda d, g: torch.ones(2)))

        def __init__(self, means, w):
            super().__init__(means.shape[1])
            self.set_parameters(means=means, w=w)

    Mixture(torch.zeros(3, 2), torch.ones(3))
    with pytest.raises(ebmcore.InputError, match=r"w must have shape \(K,\) = \(3,\), got \(4,\)"):
        Mixture(torch.zeros(3, 2), torch.ones(4))


def test_set_parameters_takes_exactly_the_declared_parameters():
    class One(AnalyticEnergy):
        op = "one"
        params = (scalar("k", 1.0, positive=True),)

    energy = One(2)
    with pytest.raises(TypeError, match=r"missing \['k'\], undeclared \['kk'\]"):
        energy.set_parameters(kk=1.0)
    with pytest.raises(ebmcore.InputError, match="One k must be a finite positive number"):
        energy.set_parameters(k=-1.0)


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="sample= must be a number"):
        Param("k", (), sample=lambda d, g: torch.ones(()))
    with pytest.raises(ValueError, match="give sample="):
        tensor("means", ("K", "d"))
    assert [p.kind for p in (scalar("a", 1.0), vector("v"), matrix("m"), tensor("t", ("K", "d"), lambda d, g: None))] == [
        "scalar",
        "vector",
        "matrix",
        "tensor",
    ]


# -- a new analytic energy: one class with its table and references, nothing else -----------------------------


class QuarticEnergy(AnalyticEnergy):
    """``E(x) = ¼ Σᵢ wᵢ (xᵢ − cᵢ)⁴ · scale``."""

    op = "test_quartic"
    params = (
        vector("center"),
        vector("weights", lambda d, g: 0.5 + torch.rand(d, generator=g, dtype=torch.float64), positive=True),
        scalar("scale", 2.0, positive=True),
    )

    def __init__(self, dim: int = 2, scale: float = 1.0, *, dtype=torch.float64, backend=None) -> None:
        super().__init__(dim, backend)
        self.set_parameters(center=torch.linspace(-1, 1, dim, dtype=dtype), weights=torch.ones(dim, dtype=dtype), scale=scale)

    @staticmethod
    def reference_energy(x, center, weights, scale):
        return 0.25 * scale * (weights * (x - center) ** 4).sum(-1)

    @staticmethod
    def reference_gradient(x, center, weights, scale):
        return scale * weights * (x - center) ** 3


class RegistersQuartic:
    @ebmcore.hookimpl
    def ebm_register_energies(self, registry):
        registry.register_energy("test_quartic", QuarticEnergy)


def test_a_new_analytic_energy_runs_on_the_torch_backend_once_registered(ebm_plugins):
    energy = QuarticEnergy(dim=3, scale=2.0)
    x = torch.randn(16, 3, dtype=torch.float64)
    with pytest.raises(ebmcore.UnknownComponentError, match="no kernel backend implements op 'test_quartic_energy'"):
        energy.energy(x)  # resolution goes through the kernel backends: nothing serves it yet

    ebmcore.register_plugin(RegistersQuartic(), "quartic_plugin")  # registers the energy, and nothing else
    check_energy(energy, x)
    assert ebmcore.explain("test_quartic_gradient", x).chosen.backend == "torch"
    assert ebmcore.energy("test_quartic", dim=2).kernel_args()[2] == 1.0
    assert (
        ops.op_spec("test_quartic_energy").signature == "(x: (n, d), center: (d,), weights: (d,), scale: float) -> energy: (n,)"
    )
    x, center, weights, scale = ops.sample_inputs("test_quartic_energy", n=4, d=3)
    assert x.shape == (4, 3) and weights.min() >= 0.5 and scale == 2.0


def test_a_faster_backend_for_the_new_energy_wins_and_is_checked_against_its_reference(ebm_plugins):
    def fast_gradient(x, center, weights, scale):
        return scale * weights * (x - center).pow(3)

    class Fast:
        @ebmcore.hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                ebmcore.KernelBackend(
                    "quartic_fast", [ebmcore.Kernel("test_quartic_gradient", fast_gradient, device_types=("cpu",), priority=5)]
                )
            )

    ebmcore.register_plugin(RegistersQuartic(), "quartic_plugin")
    ebmcore.register_plugin(Fast(), "quartic_fast")
    x = torch.randn(8, 2, dtype=torch.float64)
    assert ebmcore.explain("test_quartic_gradient", x).chosen.backend == "quartic_fast"
    check_energy(QuarticEnergy(dim=2), x)
    fast = registry.get("kernel", "quartic_fast").component
    assert check_kernel(fast) == ["test_quartic_gradient[float32]", "test_quartic_gradient[float64]"]
    with ebmcore.use_backend("torch"):  # the reference still serves it
        torch.testing.assert_close(QuarticEnergy(dim=2).gradient(x), fast_gradient(x, *QuarticEnergy(dim=2).kernel_args()))


def test_the_new_energy_leaves_the_builtin_ops_alone(ebm_plugins):
    ebmcore.register_plugin(RegistersQuartic(), "quartic_plugin")
    torch_kernels = registry.get("kernel", "torch").component.kernels
    assert "test_quartic_energy" in torch_kernels and "test_quartic_energy" not in ops.OPS
    assert "test_quartic_energy" not in TorchBackend().kernels  # a plain TorchBackend: the builtins only


def test_a_class_added_to_a_module_of_ebmcore_energies_is_a_builtin(monkeypatch):
    """What adding a builtin analytic energy takes: the class, in a module under ebmcore/energies/."""
    from ebmcore.energies import landscapes
    from ebmcore.testing import isolated_plugins

    added = type("AddedQuarticEnergy", (QuarticEnergy,), {"op": "added_quartic", "__module__": landscapes.__name__})
    monkeypatch.setattr(landscapes, "AddedQuarticEnergy", added, raising=False)
    builtin_analytic_energies.cache_clear()
    try:
        with isolated_plugins() as session:
            assert session.records["builtin"].provides["energy"][-2:] == ["added_quartic", "mlp"]
            assert registry.get("energy", "added_quartic").component is added
            assert {"added_quartic_energy", "added_quartic_gradient"} <= set(TorchBackend().kernels)
            assert ebmcore.energies.AddedQuarticEnergy is added
            check_energy(added(dim=3), torch.randn(5, 3, dtype=torch.float64))
    finally:
        monkeypatch.undo()
        builtin_analytic_energies.cache_clear()
    assert "added_quartic" not in builtin_analytic_energies()


def test_an_energy_with_hand_written_kernel_args_still_works_through_its_own_backend(ebm_plugins):
    """The pre-table way: kernel_args() written by hand and a backend for its ops; no torch kernels, no op spec."""

    class Legacy(AnalyticEnergy):
        op = "legacy_quartic"

        def __init__(self, dim=2, scale=1.0):
            super().__init__(dim)
            self.scale = float(scale)

        def kernel_args(self):
            return (self.scale,)

    class Plugin:
        @ebmcore.hookimpl
        def ebm_register_energies(self, registry):
            registry.register_energy("legacy_quartic", Legacy)

        @ebmcore.hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(
                ebmcore.KernelBackend(
                    "legacy_ref",
                    [
                        ebmcore.Kernel("legacy_quartic_energy", lambda x, scale: 0.25 * scale * (x**4).sum(-1)),
                        ebmcore.Kernel("legacy_quartic_gradient", lambda x, scale: scale * x**3),
                    ],
                )
            )

    ebmcore.register_plugin(Plugin(), "legacy")
    check_energy(Legacy(dim=3, scale=2.0), torch.randn(6, 3, dtype=torch.float64))
    assert "legacy_quartic_energy" not in registry.get("kernel", "torch").component.kernels
    with pytest.raises(KeyError, match="has no spec"):
        ops.op_spec("legacy_quartic_energy")
