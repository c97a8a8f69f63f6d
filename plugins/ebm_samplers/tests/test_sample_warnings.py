"""`ebm sample` judges its numbers: one warning line each, naming the fix, at R-hat > 1.01, bulk or tail ESS below
100 per chain, any divergence and E-BFMI below 0.3; recorded in metrics.json and fatal under --strict only."""

from __future__ import annotations

import json

import pytest
import torch

from ebmcore.cli import main
from ebm_samplers import run_report

from test_sample_job import _config

FINE = {"n_chains": 4, "r_hat_max": 1.005, "ess_bulk_min": 400.0, "ess_tail_min": 400.0, "divergences": 0}


@pytest.mark.parametrize(
    "change, starts",
    [
        ({"r_hat_max": 1.0101}, "R-hat max 1.010 > 1.01: the chains disagree"),
        ({"ess_bulk_min": 399.0}, "ESS bulk min 399, tail min 400 < 400 (100 per chain x 4 chains)"),
        ({"ess_tail_min": 12.0}, "ESS bulk min 400, tail min 12 < 400 (100 per chain x 4 chains)"),
        ({"divergences": 1}, "1 divergent transitions: the sampler cannot follow the energy's curvature"),
        ({"ebfmi_min": 0.21, "ebfmi_low_chains": 2}, "E-BFMI min 0.21 < 0.3 in 2 of 4 chains"),
    ],
)
def test_each_warning_at_its_threshold_and_only_there(change, starts):
    assert run_report.warnings(FINE) == []
    assert run_report.warnings({**FINE, "r_hat_max": 1.01, "ebfmi_min": 0.3, "ebfmi_low_chains": 0}) == []  # not above
    (line,) = run_report.warnings({**FINE, **change})
    assert line.startswith(starts)


@pytest.mark.parametrize("fix", ["run longer", "run more steps", "lower the step size", "reparametrise the energy"])
def test_every_warning_names_a_fix(fix):
    bad = {
        "n_chains": 4,
        "r_hat_max": 2.0,
        "ess_bulk_min": 3.0,
        "ess_tail_min": 3.0,
        "divergences": 5,
        "ebfmi_min": 0.1,
        "ebfmi_low_chains": 1,
    }
    lines = run_report.warnings(bad)
    assert len(lines) == 4 and any(fix in line for line in lines)


BAD = {"n_chains": 1000, "r_hat_max": 3.6, "ess_bulk_min": 3.0, "ess_tail_min": 3.0, "draws_std_max": 1.0}


@pytest.mark.parametrize("sampler", ["langevin", "mala", "hmc", "nuts", "parallel_tempering", "annealed_langevin", None])
def test_the_fix_never_names_the_sampler_that_ran_nor_tempering_without_modes(sampler):
    """Issue 40: a NUTS run was told to use "MALA or NUTS"; a unimodal target was told to use parallel tempering."""
    lines = run_report.warnings({**BAD, "sampler": sampler} if sampler else BAD)
    assert len(lines) == 2
    for line in lines:
        fix = line.split("; ", 1)[1]
        assert "parallel_tempering" not in fix or sampler == "parallel_tempering", line
        if sampler in ("langevin", "mala", "hmc", "nuts"):
            assert f"{sampler.upper()} or" not in fix and f"use {sampler.upper()}" not in fix, line
            assert (
                f"rather than {'unadjusted Langevin' if sampler == 'langevin' else sampler.upper()}" in fix or sampler == "nuts"
            )
    if sampler in ("mala", "hmc"):
        assert all("NUTS" in line for line in lines) and "mass matrix" in lines[0]
    if sampler == "nuts":
        assert all("NUTS" not in line.split("; ", 1)[1] for line in lines) and "longer warm-up" in lines[0]


def test_a_high_r_hat_with_a_tiny_step_size_calls_for_nuts_and_its_mass_matrix():
    """Issue 40: MALA adapted a step size of 0.00083 and left R-hat at 3.6 on a unimodal target; NUTS with its
    mass-matrix adaptation and a longer warm-up fixed it (R-hat 1.016)."""
    (line, _) = run_report.warnings({**BAD, "sampler": "mala", "step_size": 0.00083})
    assert "the step size 0.00083 moves about 0.041 per step against the draws' spread 1" in line
    assert 'NUTS with its mass-matrix adaptation and a longer warm-up (name = "nuts", warmup = 1000' in line
    assert "parallel_tempering" not in line
    assert "step size" not in run_report.warnings({**BAD, "sampler": "mala", "step_size": 0.5})[0]  # not tiny


def test_tempering_is_named_when_the_chains_means_fall_in_separate_groups():
    g = torch.Generator().manual_seed(0)
    stuck = torch.cat([torch.randn(100, 20, 2, generator=g) * 0.3 - 2, torch.randn(100, 20, 2, generator=g) * 0.3 + 2], 1)
    crawling = torch.randn(1, 40, 2, generator=g) + 0.01 * torch.randn(100, 40, 2, generator=g).cumsum(0)
    s = {"n_steps": 100, "burn_in": 0, "name": "mala"}
    two = run_report.metrics(stuck[-1], stuck, s, 1.0, 0.6, 0)
    one = run_report.metrics(crawling[-1], crawling, s, 1.0, 0.6, 0)
    assert two["mode_groups"]["sizes"] == [20, 20] and one["mode_groups"] is None and two["sampler"] == "mala"
    (line, *_) = run_report.warnings({**two, "r_hat_max": 2.0})
    assert "their means fall in separate groups (20 and 20 chains" in line and "use parallel_tempering" in line
    (line, *_) = run_report.warnings({**one, "r_hat_max": 2.0})
    assert "parallel_tempering" not in line and "NUTS rather than MALA" in line
    assert run_report.mode_groups(torch.randn(8, 2, generator=g) * 5) is None  # too few chains to tell


def test_a_streamed_run_and_missing_diagnostics_warn_of_nothing():
    assert run_report.warnings({"n_samples": 10, "n_chunks": 1, "acceptance": 0.5}) == []
    assert run_report.warnings({"n_chains": 4, "r_hat_max": None, "ess_bulk_min": None, "ess_tail_min": None}) == []
    assert run_report.warnings({**FINE, "r_hat_max": float("nan")}) == []


def test_ebfmi_comes_from_the_hamiltonian_of_the_draws():
    g = torch.Generator().manual_seed(0)
    independent = torch.randn(400, 3, generator=g, dtype=torch.float64)  # E-BFMI about 2
    sticky = torch.randn(400, 2, generator=g, dtype=torch.float64).cumsum(0)  # a random walk: E-BFMI near 0
    trajectory = torch.randn(400, 5, 2, generator=g)
    s = {"n_steps": 400, "burn_in": 0}
    out = run_report.metrics(
        trajectory[-1], trajectory, s, 1.0, 0.8, 0, stats={"hamiltonian": torch.cat([independent, sticky], 1)}
    )
    assert out["ebfmi_low_chains"] == 2 and out["ebfmi_min"] < 0.05
    assert "ebfmi_min" not in run_report.metrics(trajectory[-1], trajectory, s, 1.0, 0.8, 0)  # not a Hamiltonian sampler


def test_chains_that_never_mixed_warn_and_fail_only_under_strict(tmp_path, capsys):
    # ULA at its small default step on the three-mode mixture: 150 steps do not mix the modes (R-hat, ESS)
    cfg = _config(tmp_path, "langevin", warmup=0, plots="false")
    out = tmp_path / "run"
    assert main(["sample", str(cfg), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["r_hat_max"] > 1.01 and metrics["ess_bulk_min"] < 100 * 200
    assert [w.split(":")[0] for w in metrics["warnings"]] == [
        f"R-hat max {metrics['r_hat_max']:.3f} > 1.01",
        f"ESS bulk min {metrics['ess_bulk_min']:.0f}, tail min "
        f"{metrics['ess_tail_min']:.0f} < 20000 (100 per chain x 200 chains)",
    ]
    assert [line for line in printed.splitlines() if line.startswith("warning: ")] == [
        f"warning: {w}" for w in metrics["warnings"]
    ]
    assert main(["sample", str(cfg), "--out", str(tmp_path / "strict"), "--quiet", "--strict"]) == 1
    assert "error: --strict: 2 warnings (above, and in" in capsys.readouterr().err


DIVERGING = """
[energy]
name = "rosenbrock"

[sampler]
name = "nuts"
params = { step_size = 0.1, max_tree_depth = 4, fused = false }  # per step: the Hamiltonian is recorded
n_chains = 32
n_steps = 40
burn_in = 0
warmup = 0

[output]
plots = false
"""


def test_divergences_warn_with_the_fix(tmp_path, capsys):
    cfg = tmp_path / "nuts.toml"
    cfg.write_text(DIVERGING)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["divergences"] > 0 and "ebfmi_min" in metrics  # NUTS records its Hamiltonian: E-BFMI is judged
    line = next(w for w in metrics["warnings"] if "divergent" in w)
    assert line.startswith(f"{metrics['divergences']} divergent transitions") and "lower the step size" in line
    assert f"warning: {line}" in capsys.readouterr().out


def test_a_run_without_plots_does_not_say_it_wrote_them(tmp_path, capsys, monkeypatch):
    from ebmcore import plotting

    monkeypatch.setattr(plotting, "unavailable", lambda: "matplotlib is not installed: pip install 'ebmcore[plot]'")
    assert main(["sample", str(_config(tmp_path, "mala", warmup=0)), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "plots and samples in" not in printed
    assert f"samples in {tmp_path / 'run'} (no plots: matplotlib is not installed" in printed
    assert not list((tmp_path / "run").glob("*.png"))


def test_a_streamed_run_says_its_cost_up_front(tmp_path, capsys):
    cfg = _config(tmp_path, "langevin", warmup=0, plots="false")  # burn_in 50, n_steps 100
    assert main(["sample", str(cfg), "--out", str(tmp_path / "s"), "--n-samples", "25", "--chunk-size", "10"]) == 0
    err = capsys.readouterr().err
    assert (
        "streaming 25 samples in 3 chunks of up to 10 chains, 150 steps each (burn_in 50 + n_steps 100): 3,750 chain-steps" in err
    )


def test_a_stream_without_a_terminal_logs_its_progress(tmp_path, caplog):
    import logging

    import ebmcore
    from ebmcore.chunks import stream_chunks
    from ebm_samplers import LangevinSampler

    sampler = LangevinSampler(ebmcore.energy("gaussian", dim=2), step_size=0.1, fused=False)
    with caplog.at_level(logging.INFO, logger="ebmcore.chunks"):
        stream_chunks(
            sampler,
            25,
            10,
            5,
            tmp_path / "c",
            initial=lambda n, g: torch.randn(n, 2, generator=g),
            seed=0,
            device=torch.device("cpu"),
            report_every=0.0,
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "ebmcore.chunks"]
    assert [line.split(":")[0] for line in lines] == ["chunk 1 of 3 done", "chunk 2 of 3 done"]  # not after the last
    assert all(line.endswith(" left") and "chain-steps/s, about " in line for line in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ebmcore.chunks"):  # the default: a bar or nothing, no log lines
        stream_chunks(
            sampler,
            25,
            10,
            5,
            tmp_path / "d",
            initial=lambda n, g: torch.randn(n, 2, generator=g),
            seed=0,
            device=torch.device("cpu"),
        )
    assert not [r for r in caplog.records if r.name == "ebmcore.chunks"]
