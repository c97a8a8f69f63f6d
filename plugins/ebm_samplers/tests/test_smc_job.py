"""``ebm sample`` with ``[sampler] name = "smc"`` (``ebm_samplers.smc_job``): the log evidence and the mode weights of a
two-mode mixture through the CLI against their exact values, the files and metrics of a run, the options refused, the
warnings, and the transcripts of docs/samplers.md."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from ebmcore.cli import main
from ebm_samplers import smc_job

MIXTURE = """\
[energy]
name = "gaussian_mixture"
params = { means = [[4.0, 4.0], [-4.0, -4.0]], stds = 0.5, weights = [0.7, 0.3] }

[sampler]
name = "smc"
n_chains = 1000
init_scale = 4.0
params = { kernel = "mala", n_mcmc_steps = 5, target_ess = 0.5 }

[output]
plots = false
"""
"""``0.7·N((4, 4), 0.5²I) + 0.3·N((−4, −4), 0.5²I)``, normalised: exact ``log Z = 0``."""


def _config(tmp_path: Path, text: str = MIXTURE, name: str = "smc.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_log_evidence_and_mode_weights_of_a_mixture_through_the_cli(tmp_path, capsys):
    """8 runs (seeds 0–7) of 1000 particles: each ``log Z`` within 4 of its reported SEs of 0 (over 40 seeds the
    z-scores had a standard deviation of 1.05), their mean within 3 of its SE; the equal-weight samples' share of the
    mode at (4, 4) within 3 SE (the spread of the 8 runs: one run's particles are correlated through resampling) of
    0.7, and every sample in one of the two modes."""
    config = _config(tmp_path)
    estimates, ses, upper = [], [], []
    for seed in range(8):
        out = tmp_path / f"run{seed}"
        assert main(["sample", config, "--seed", str(seed), "--out", str(out), "--quiet"]) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        z, se = metrics["log_evidence"], metrics["log_evidence_se"]
        assert 0.02 < se < 0.1 and abs(z) < 4 * se, (seed, z, se)
        estimates.append(z)
        ses.append(se)
        samples = np.load(out / "samples.npz")["samples"]
        assert samples.shape == (1000, 2)
        near = np.minimum(np.abs(samples - 4).max(1), np.abs(samples + 4).max(1))
        assert (near < 0.5 * 5).all()  # within 5 standard deviations of a mode
        upper.append(float((samples[:, 0] > 0).mean()))
    pooled = math.sqrt(sum(se**2 for se in ses)) / len(ses)
    assert abs(sum(estimates) / len(estimates)) < 3 * pooled, (estimates, pooled)
    se = float(np.std(upper, ddof=1)) / math.sqrt(len(upper))
    assert 0.003 < se < 0.03 and abs(float(np.mean(upper)) - 0.7) < 3 * se, (upper, se)
    printed = capsys.readouterr().out
    assert printed.count("smc on gaussian_mixture (cpu)") == 8 and "log Z = " in printed


def test_the_files_and_metrics_of_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sample", _config(tmp_path), "--out", str(out), "--quiet", "--strict"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    k = metrics["n_stages"]
    assert metrics["sampler"] == "smc" and metrics["n_particles"] == 1000 and metrics["warnings"] == []
    assert len(metrics["betas"]) == k + 1 and metrics["betas"][0] == 0.0 and metrics["betas"][-1] == 1.0
    assert len(metrics["ess"]) == k and metrics["ess_min"] == min(metrics["ess"]) == pytest.approx(500)
    assert metrics["ess_final"] == metrics["ess"][-1] >= 500 - 1e-6
    assert len(metrics["acceptance"]) == k - 1 and metrics["acceptance_min"] == min(metrics["acceptance"]) > 0.3
    particles = np.load(out / "particles.npz")
    assert particles["particles"].shape == (1000, 2) and particles["log_weights"].shape == (1000,)
    assert np.logaddexp.reduce(particles["log_weights"]) == pytest.approx(0.0, abs=1e-9)
    assert particles["log_evidence_increments"].sum() == pytest.approx(metrics["log_evidence"])
    for name in ("betas", "ess", "acceptance", "step_sizes"):
        assert particles[name].shape == ((k + 1,) if name == "betas" else (k,) if name == "ess" else (k - 1,))
    # the weighted particles and the equal-weight samples agree on the mode weight (resampling is unbiased)
    w = np.exp(particles["log_weights"])
    samples = np.load(out / "samples.npz")["samples"]
    assert abs(float((w * (particles["particles"][:, 0] > 0)).sum()) - float((samples[:, 0] > 0).mean())) < 0.05
    assert metrics["plots_skipped"] == "[output] plots = false"
    # the run is not run again; with draws = "none" there is no particles.npz
    assert main(["sample", _config(tmp_path), "--out", str(out), "--quiet"]) == 0
    none = tmp_path / "none"
    assert main(["sample", _config(tmp_path), "--out", str(none), "--format", "none", "--quiet"]) == 0
    assert not (none / "particles.npz").exists() and (none / "samples.npz").exists()
    assert "particles.npz" not in capsys.readouterr().out.split("smc on")[-1]


@pytest.mark.parametrize(
    "change, flags, message",
    [
        (("n_chains = 1000", "n_chains = 1000\nburn_in = 100"), [], "smc.toml [sampler] burn_in = 100: does not apply"),
        (("n_chains = 1000", "n_chains = 1000\nn_steps = 100"), [], "[sampler] n_steps = 100: does not apply"),
        (("n_chains = 1000", "n_chains = 1000\nthin = 2"), [], "[sampler] thin = 2: does not apply"),
        (("n_chains = 1000", 'n_chains = 1000\nmetric = "dense"'), [], "[sampler] metric = 'dense': does not apply"),
        (("[output]", "[output]\nlive_log = true"), [], "[output] live_log = true: does not apply"),
        (("[output]", "[run]\ncheckpoint_every = 10\n[output]"), [], "[run] checkpoint_every = 10: does not apply"),
        (None, ["--n-steps", "10"], "--n-steps 10: does not apply to name = 'smc': SMC runs as many stages"),
        (None, ["--warmup", "100"], "--warmup 100: does not apply to name = 'smc'"),
        (None, ["--n-samples", "10"], "--n-samples 10: does not apply to name = 'smc'"),
        (None, ["--format", "netcdf"], "draws = 'netcdf': an smc run has no chains for ArviZ"),
        (None, ["--n-chains", "1"], "n_chains = 1: an smc run needs at least 2 particles"),
        (("n_mcmc_steps = 5", "n_mcmc_step = 5"), [], "smc takes no n_mcmc_step; its params are kernel, kernel_params"),
        (("n_mcmc_steps = 5", "scale = 2.0"), [], "scale: the base's standard deviation is [sampler] init_scale"),
        (("target_ess = 0.5", "target_ess = 1.5"), [], "target_ess must be a number in (0, 1), got 1.5"),
        (('kernel = "mala"', 'kernel = "langevin"'), [], "kernel 'langevin' cannot move SMC particles"),
        (("n_mcmc_steps = 5", "kernel_params = { n_leapfrog_steps = 3 }"), [], "mala has no param(s) n_leapfrog_steps"),
        (("n_mcmc_steps = 5", "adapt = 1"), [], "adapt must be true or false, got 1"),
        (("n_mcmc_steps = 5", "loc = [1.0, 2.0, 3.0]"), [], "loc = [1.0, 2.0, 3.0] does not fit the energy's event shape (2,)"),
        (None, ["--resume"], "--resume continues a streamed or checkpointed run, and an smc run is neither"),
    ],
)
def test_options_that_do_not_apply_or_are_out_of_range_are_refused(tmp_path, capsys, change, flags, message):
    text = MIXTURE if change is None else MIXTURE.replace(*change)
    assert main(["sample", _config(tmp_path, text), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err


def test_values_that_change_nothing_and_the_bundled_configuration_run(tmp_path, capsys):
    """``burn_in = 0``, ``thin = 1``, ``warmup = 0`` are accepted; ``--sampler smc`` on the bundled configuration (whose
    burn_in, warmup and n_steps are a Markov-chain run's) runs, and ``--step-size`` sets the moves' first step size."""
    text = MIXTURE.replace("n_chains = 1000", "n_chains = 200\nburn_in = 0\nthin = 1\nwarmup = 0")
    assert main(["sample", _config(tmp_path, text), "--out", str(tmp_path / "a"), "--step-size", "0.05", "--quiet"]) == 0
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["step_sizes"][0] == pytest.approx(0.05)
    assert main(["sample", "--sampler", "smc", "--n-chains", "200", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "smc on gaussian_mixture (cpu)" in capsys.readouterr().out


def test_warnings_name_the_fix(tmp_path, capsys):
    """Too few particles (a standard error above 0.2 nats), a target ESS of 0.05 (the weights on a few particles) and
    no moves each give their warning, and ``--strict`` exits with 1; the limits' edges from metrics."""
    small = MIXTURE.replace("n_chains = 1000", "n_chains = 40")
    assert main(["sample", _config(tmp_path, small), "--out", str(tmp_path / "a"), "--quiet", "--strict"]) == 1
    printed = capsys.readouterr()
    assert "warning: log Z standard error" in printed.out and "use more particles (n_chains" in printed.out
    assert "judgement: 1 warning below" in printed.out and "error: --strict: 1 warning" in printed.err
    low = MIXTURE.replace("target_ess = 0.5", "target_ess = 0.05")
    assert main(["sample", _config(tmp_path, low), "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "raise params.target_ess (now 0.05) toward 0.5" in capsys.readouterr().out
    still = MIXTURE.replace("n_mcmc_steps = 5", "n_mcmc_steps = 0")
    assert main(["sample", _config(tmp_path, still), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert "no moves between" in capsys.readouterr().out

    ok = {
        "n_particles": 1000,
        "log_evidence_se": smc_job.SE_LIMIT,
        "ess_min": 100.0,
        "ess_fraction_min": smc_job.ESS_FRACTION_LIMIT,
        "ess_final": 600.0,
        "ess_fraction_final": 0.6,
        "target_ess": 0.5,
        "acceptance_min": smc_job.ACCEPTANCE_LIMIT,
        "kernel": "mala",
        "n_stages": 5,
    }
    assert smc_job.warnings(ok) == []
    bad = dict(ok, log_evidence_se=float("nan"), ess_min=50.0, ess_fraction_min=0.05, acceptance_min=0.05)
    found = smc_job.warnings(bad)
    assert len(found) == 3 and "a smaller params.min_step" in found[1] and 'kernel = "hmc" or "nuts"' in found[2]


def test_the_smc_transcripts_of_samplers_md_print_what_ebm_prints(tmp_path, monkeypatch, capsys):
    """Every ``$ ebm`` line of the SMC section of docs/samplers.md, run in order in an empty directory with its
    ``smc.toml``: the output is the page's but for the measured time, and the ``log Z`` estimates, which are compared
    within 2 standard errors (their last digits follow the CPU's rounding)."""
    pytest.importorskip("matplotlib")  # the summary says the plot was written
    page = (Path(__file__).resolve().parents[3] / "docs" / "samplers.md").read_text()
    section = page.split("\n### `ebm sample` with SMC\n")[1].split("\n## ")[0]
    (tmp_path / "smc.toml").write_text(re.search(r"```toml\n# smc.toml\n(.*?)```", section, re.S).group(1))
    monkeypatch.chdir(tmp_path)
    blocks = [block for block in re.findall(r"```\n(\$ .*?)```", section, re.S)]
    commands = [c for block in blocks for c in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", block, re.M)]
    assert len(commands) == 3
    timing = re.compile(r"\): [\d.]+ s \(")
    estimate = re.compile(r"log Z = (-?[\d.]+) ± ([\d.]+)")
    for command, shown in commands:
        capsys.readouterr()
        status = main(shlex.split(command)[1:])
        assert status == (2 if shown.startswith("error: ") else 0), command
        captured = capsys.readouterr()
        printed = captured.err + captured.out
        for got, want in zip(estimate.findall(printed), estimate.findall(shown), strict=True):
            assert abs(float(got[0]) - float(want[0])) <= 2 * max(float(got[1]), float(want[1])), (got, want)
        normalise = lambda text: estimate.sub("log Z", timing.sub("): s (", text))  # noqa: E731
        assert normalise(printed) == normalise(shown), command


def test_the_log_z_of_a_model_file_from_ebm_train(tmp_path):
    """``[energy] model``: the normaliser of a model written by ``ebm train`` (here a Gaussian energy of covariance
    ``diag(0.25, 9)`` saved in that format), within 4 reported standard errors of ``log 2π + ½ log det Σ``: what a
    held-out log-likelihood ``−E(x) − log Z`` needs."""
    import torch

    import ebmcore

    energy = ebmcore.energy("gaussian", dim=2)
    state = dict(
        energy.state_dict(), precision=torch.diag(torch.tensor([4.0, 1 / 9])), covariance=torch.diag(torch.tensor([0.25, 9.0]))
    )
    torch.save({"energy": "gaussian", "params": {"dim": 2}, "state_dict": state}, tmp_path / "model.pt")
    text = MIXTURE.split("[sampler]")[1].replace("init_scale = 4.0", "init_scale = 6.0")
    config = _config(tmp_path, f'[energy]\nmodel = "{(tmp_path / "model.pt").as_posix()}"\n\n[sampler]{text}')
    assert main(["sample", config, "--out", str(tmp_path / "o"), "--quiet"]) == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    exact = math.log(2 * math.pi) + 0.5 * math.log(0.25 * 9.0)
    assert abs(metrics["log_evidence"] - exact) < 4 * metrics["log_evidence_se"] < 0.4, (metrics["log_evidence"], exact)
