"""Kernel resolution by device capability, overrides, strictness and explanations."""

import pytest
import torch

import ebmcore
from ebmcore import Kernel, KernelBackend
from ebmcore.errors import BackendUnavailableError, UnknownComponentError
from ebmcore.testing import isolated_plugins


def _fast(x, barrier):
    return torch.full_like(x, 7.0)  # recognisable output: proves which kernel ran


class FakeCUDA:
    """A CUDA-only backend with a priority above torch's."""

    @ebmcore.hookimpl
    def ebm_register_kernels(self, registry):
        registry.register_kernel_backend(
            KernelBackend(
                "fakecuda",
                [Kernel("double_well_gradient", _fast, device_types=("cuda",), priority=100, min_compute_capability=(8, 0))],
            )
        )


class FastCPU:
    @ebmcore.hookimpl
    def ebm_register_kernels(self, registry):
        registry.register_kernel_backend(
            KernelBackend(
                "fastcpu", [Kernel("double_well_gradient", _fast, device_types=("cpu",), dtypes=(torch.float32,), priority=50)]
            )
        )


class Broken(KernelBackend):
    def unavailable_reason(self):
        return "extension failed to build: nvcc not found"


class BrokenPlugin:
    @ebmcore.hookimpl
    def ebm_register_kernels(self, registry):
        registry.register_kernel_backend(Broken("broken", [Kernel("double_well_gradient", _fast, priority=200)]))


X = torch.ones(4, 2)


def test_cuda_only_kernel_is_not_chosen_on_cpu_and_explain_says_why():
    with isolated_plugins(FakeCUDA()):
        why = ebmcore.explain("double_well_gradient", X)
        assert why.chosen.backend == "torch"
        fake = next(c for c in why.candidates if c.backend == "fakecuda")
        assert not fake.chosen and "device type 'cpu' not supported (supports cuda)" in fake.reason
        assert torch.equal(ebmcore.energy("double_well").gradient(X), torch.zeros_like(X))


def test_compute_capability_and_dtype_are_checked():
    kernel = Kernel("op", _fast, device_types=("cuda",), dtypes=(torch.float32,), min_compute_capability=(8, 0))
    cuda = torch.device("cuda", 0)
    assert "compute capability 7.0 below the required 8.0" in kernel.mismatch(cuda, torch.float32, (7, 0))
    assert kernel.mismatch(cuda, torch.float32, (9, 0)) is None
    assert "dtype float64 not supported (supports float32)" in kernel.mismatch(cuda, torch.float64, (9, 0))


def test_highest_priority_kernel_that_can_run_is_chosen_per_dtype():
    with isolated_plugins(FastCPU(), FakeCUDA()):
        energy = ebmcore.energy("double_well")
        assert torch.equal(energy.compute_gradient(X), torch.full_like(X, 7.0))
        assert ebmcore.explain("double_well_gradient", X.double()).chosen.backend == "torch"


def test_unavailable_backend_reports_its_reason():
    with isolated_plugins(BrokenPlugin()):
        why = ebmcore.explain("double_well_gradient", X)
        assert why.chosen.backend == "torch"
        assert "cannot run: extension failed to build: nvcc not found" in str(why)


def test_environment_variable_forces_the_reference(monkeypatch):
    with isolated_plugins(FastCPU()):
        energy = ebmcore.energy("double_well")
        assert energy.compute_gradient(X)[0, 0] == 7.0
        monkeypatch.setenv("EBM_BACKEND", "torch")
        assert energy.compute_gradient(X)[0, 0] == 0.0
        why = ebmcore.explain("double_well_gradient", X)
        assert why.selection_source == "EBM_BACKEND=torch"
        assert "not in the backend selection ['torch']" in str(why)


def test_context_manager_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("EBM_BACKEND", "fastcpu")
    with isolated_plugins(FastCPU()):
        energy = ebmcore.energy("double_well")
        assert energy.compute_gradient(X)[0, 0] == 7.0
        with ebmcore.use_backend("torch"):
            assert energy.compute_gradient(X)[0, 0] == 0.0
        assert energy.compute_gradient(X)[0, 0] == 7.0


def test_explicit_backend_is_strict_and_never_falls_back():
    with isolated_plugins(FakeCUDA()):
        with pytest.raises(BackendUnavailableError) as err:
            ebmcore.resolve_kernel("double_well_gradient", X.device, X.dtype, backend="fakecuda")
        assert "device type 'cpu' not supported" in str(err.value) and "Fix:" in str(err.value)
        with pytest.raises(BackendUnavailableError):
            ebmcore.energy("double_well", backend="fakecuda").gradient(X)


def test_a_selection_with_a_fallback_falls_back_in_order():
    with isolated_plugins(FakeCUDA()):
        with ebmcore.use_backend("fakecuda", "torch"):
            why = ebmcore.explain("double_well_gradient", X)
            assert [c.backend for c in why.candidates] == ["fakecuda", "torch"]
            assert why.chosen.backend == "torch"
        with ebmcore.use_backend("fakecuda"):
            with pytest.raises(BackendUnavailableError, match="EBM_BACKEND=cuda,torch"):
                ebmcore.energy("double_well").gradient(X)


def test_selecting_an_unknown_backend_says_what_to_install(monkeypatch):
    monkeypatch.setenv("EBM_BACKEND", "cuda")
    with isolated_plugins(autoload=True, disable=("cuda",)):  # as if ebm-cuda were not installed
        with pytest.raises(UnknownComponentError, match="pip install ebm-cuda"):
            ebmcore.energy("double_well").gradient(X)


def test_unknown_op_lists_the_known_ones():
    with pytest.raises(UnknownComponentError, match="Known ops: .*gaussian_energy"):
        ebmcore.dispatch("no_such_op", X)


def test_choices_are_cached_and_reset_with_the_plugins():
    ebmcore.resolve_kernel("gaussian_energy", X.device, X.dtype)
    assert any(key[0] == "gaussian_energy" for key in ebmcore.plugins.session().kernel_cache)
    ebmcore.plugins.reset()
    assert ebmcore.plugins.session().kernel_cache == {}


def test_config_file_selects_the_backend(tmp_path, monkeypatch):
    (tmp_path / "ebm.toml").write_text('backend = ["torch"]\n')
    monkeypatch.chdir(tmp_path)
    ebmcore.reload_config()
    with isolated_plugins(FastCPU()):
        why = ebmcore.explain("double_well_gradient", X)
        assert why.chosen.backend == "torch" and "ebm.toml" in why.selection_source
        monkeypatch.setenv("EBM_BACKEND", "fastcpu")  # the environment beats the file
        assert ebmcore.explain("double_well_gradient", X).chosen.backend == "fastcpu"


def test_dispatch_needs_a_tensor():
    with pytest.raises(TypeError, match="needs a tensor input"):
        ebmcore.explain("gaussian_energy")


def test_a_selected_backend_without_the_op_is_named():
    with isolated_plugins(FastCPU()):
        with ebmcore.use_backend("fastcpu", "torch"):
            why = ebmcore.explain("gaussian_gradient", X)
        assert why.chosen.backend == "torch"
        assert "selected, but backend 'fastcpu' has no kernel for gaussian_gradient" in str(why)
        assert why.selection_source == "use_backend('fastcpu', 'torch')"


def test_clashing_backend_names_show_in_explain():
    class Again:
        @ebmcore.hookimpl
        def ebm_register_kernels(self, registry):
            registry.register_kernel_backend(KernelBackend("fastcpu", [Kernel("double_well_gradient", _fast)]))

    with isolated_plugins(("one", FastCPU()), ("two", Again())):
        why = ebmcore.explain("double_well_gradient", X)
        assert why.chosen.backend == "torch"
        assert "left out: registered by several plugins (one, two)" in str(why)


def test_ebm_backends_fails_when_an_op_cannot_run(monkeypatch, capsys):
    from ebmcore.cli import main

    with isolated_plugins(FakeCUDA()):
        monkeypatch.setenv("EBM_BACKEND", "fakecuda")
        assert main(["backends", "--device", "cpu", "--op", "double_well_gradient"]) == 1
    assert "have no kernel that can run" in capsys.readouterr().out
