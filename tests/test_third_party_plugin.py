"""A real third-party distribution, built and installed by pip, plugs in without touching the core."""

import json
import math
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
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(FIXTURE),
        ],
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


def _quartic_x2() -> float:
    """E[x²] under p(x) ∝ exp(−x⁴/4), per coordinate, by quadrature."""
    xs = torch.linspace(-6, 6, 100_001, dtype=torch.float64)
    w = torch.exp(-(xs**4) / 4)
    return float(torch.trapezoid(xs**2 * w, xs) / torch.trapezoid(w, xs))


def test_the_third_party_sampler_runs_the_whole_loop_in_python(example):
    sampler = registry.get("sampler", "example_ula")(registry.get("energy", "quartic")(dim=2), step_size=0.05)
    result = sampler.sample(
        torch.randn(400, 2),
        200,
        burn_in=100,
        thin=4,
        return_trajectory=True,
        return_diagnostics=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert result.trajectory.shape == (50, 400, 2) and result.diagnostics.mean.shape == (50, 2)
    assert result.diagnostics.acceptance is None  # its info carries no acceptance: reported as absent, not made up
    se = 1.0 / math.sqrt(800)  # sd of x² is below 1 here; 800 values
    assert abs(float((result.samples**2).mean()) - _quartic_x2()) < 5 * se + 0.05  # + ULA's O(h) bias at h = 0.05


def test_the_third_party_sampler_runs_in_ebm_sample_profile_and_train(example, tmp_path, capsys):
    from ebmcore.cli import main

    config = FIXTURE / "configs" / "sample.toml"  # the files docs/plugins.md shows
    assert main(["sample", str(config), "--out", str(tmp_path / "sample")]) == 0
    captured = capsys.readouterr()
    assert "warm-up skipped: ExampleULA is a plain ebmcore.Sampler: warm-up adapts the step_size" in captured.err
    assert "info.acceptance_prob" in captured.err
    metrics = json.loads((tmp_path / "sample" / "metrics.json").read_text())
    assert metrics["step_size"] == 0.05 and metrics["step_size_source"] == "given" and metrics["n_kept"] == 1000
    assert metrics["ess_bulk_min"] > 100 and metrics["r_hat_max"] < 1.05 and "acceptance" not in metrics
    samples = torch.load(tmp_path / "sample" / "samples.pt", weights_only=True)
    assert abs(float((samples**2).mean()) - _quartic_x2()) < 5 / math.sqrt(800) + 0.05

    assert main(["profile", str(config), "--n-chains", "50", "--n-steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "ms per step" in out and "ExampleULA is not an ebm_samplers algorithm: timed as a whole" in out

    train = FIXTURE / "configs" / "train.toml"
    assert main(["train", str(train), "--out", str(tmp_path / "train")]) == 0
    captured = capsys.readouterr()
    assert "model samples without warm-up: ExampleULA" in captured.err
    out = captured.out
    model_samples = torch.load(tmp_path / "train" / "samples.pt", weights_only=True)
    assert model_samples.shape == (100, 2) and torch.isfinite(model_samples).all()
    metrics = json.loads((tmp_path / "train" / "metrics.json").read_text())
    assert math.isfinite(metrics["final_loss"])
    # issue 28: this run's grid NLL and AIS log-likelihood were 4.5 nats apart, printed as reliable, with no warning
    (record,) = [r for r in metrics["warnings"] if r["quantity"] == "held-out log-likelihood"]  # grid against AIS
    assert abs(record["difference"]) > 3 * record["combined_error"] and "warning: held-out log-likelihood" in out
    assert metrics["ais"]["reliable"] is False and metrics["grid"]["reliable"] is False
