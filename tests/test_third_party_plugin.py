"""A real third-party distribution, built and installed by pip, plugs in without touching the core."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ebmcore
from ebmcore import plugins, registry
from ebmcore.testing import check_energy, check_kernel, check_sampler

FIXTURE = Path(__file__).parent / "fixtures" / "ebm_example_plugin"


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(FIXTURE)],
        check=True,
    )
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith("ebm_example_plugin")]:
        del sys.modules[name]


@pytest.fixture
def example(installed_example):
    plugins.reset()
    yield
    plugins.reset()


def test_core_finds_sampler_energy_and_kernel_by_name_with_provider(example):
    for kind, name in [("sampler", "example_ula"), ("energy", "quartic"), ("kernel", "example")]:
        entry = registry.get(kind, name)
        assert (entry.distribution, entry.version, entry.plugin) == ("ebm-example-plugin", "1.2.3", "example"), entry


def test_the_third_party_kernel_wins_where_it_can_run(example):
    x = torch.randn(8, 2)
    why = ebmcore.explain("double_well_gradient", x)
    assert why.chosen.backend == "example"
    assert "can run; example comes first" in str(why)
    # float16 is outside what the example kernel declares: the torch reference takes over.
    assert ebmcore.explain("double_well_gradient", x.half()).chosen.backend == "torch"
    energy = ebmcore.energy("double_well", dim=2)
    torch.testing.assert_close(energy.gradient(x), 4 * x * (x * x - 1))


def test_the_third_party_components_pass_the_contract_checks(example):
    check_sampler(lambda energy: registry.get("sampler", "example_ula")(energy, step_size=0.05))
    check_energy(registry.get("energy", "quartic")(dim=3), torch.randn(16, 3, dtype=torch.float64))
    checked = check_kernel(registry.get("kernel", "example").component)
    assert "double_well_gradient[float32]" in checked and "double_well_energy[float64]" in checked
