"""The digits figures in docs/losses.md come from the recorded runs under benchmarks/results/: each number a table
shows is the recorded metrics.json's, rounded as shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOSSES = (ROOT / "docs" / "losses.md").read_text().replace("\u2212", "-")  # the docs write minus signs as −


def _row(label: str) -> str:
    (line,) = [line for line in LOSSES.splitlines() if line.startswith("|") and label in line]
    return line


@pytest.mark.parametrize("run, label", [("digits_eqm", "`ebm train digits_eqm`"), ("digits_dsm", "`ebm train digits_dsm`")])
def test_the_sample_quality_table_is_the_recorded_runs(run, label):
    q = json.loads((RESULTS / "2026-11-28-digits-sample-quality" / run / "metrics.json").read_text())["sample_quality"]
    row = next(line for line in LOSSES.splitlines() if line.startswith("|") and label in line and "×" in line and "%" in line)
    shown = [
        f"{q['classifier_ratio']:.2f}",
        f"{q['feature_frechet_distance']:.1f}",
        f"{q['feature_frechet_floor']:.1f}",
        f"{q['feature_frechet_ratio']:.1f}×",
        f"{q['pixel_wasserstein']:.3f}",
        f"{100 * q['saturated_fraction_samples']:.1f} %",
        f"{100 * q['mid_grey_fraction_samples']:.1f} %",
    ]
    assert all(s in row for s in shown), (row, shown)


def test_the_dequantised_likelihood_table_is_the_recorded_run():
    m = json.loads((RESULTS / "2026-11-28-digits-density-dequantised" / "metrics.json").read_text())
    d, b = m["dequantised"], m["baselines"]
    model = _row("`digits_density`, AIS")
    assert f"{d['test_log_likelihood']:+.3f} ± {d['test_mean_se']:.3f}" in model and f"{d['bits_per_dim']:.3f}" in model
    for name, label in [
        ("diagonal_gaussian", "diagonal Gaussian"),
        ("gaussian", "full-covariance Gaussian"),
        ("gaussian_mixture", "Gaussian mixture"),
    ]:
        row = _row(label)
        margin = d["margins"][name]
        assert f"{b[name]['log_likelihood']:+.3f} ± {b[name]['standard_error']:.3f}" in row, row
        assert f"{b[name]['bits_per_dim']:.3f}" in row and f"{margin['margin']:+.2f} ± {margin['standard_error']:.2f}" in row, row


def test_the_jem_table_is_the_recorded_runs():
    runs = RESULTS / "2026-11-28-digits-jem"
    jem, plain = (json.loads((runs / name).read_text())["jem"] for name in ("metrics.json", "metrics_generative_weight_0.json"))
    for key, label, shown in [
        ("accuracy", "held-out accuracy", lambda v: f"{100 * v:.1f} %"),
        ("nll", "held-out cross-entropy", lambda v: f"{v:.3f}"),
        ("ece", "expected calibration error", lambda v: f"{v:.3f}"),
    ]:
        row = _row(label)
        assert shown(jem[key]) in row and shown(plain[key]) in row, (row, jem[key], plain[key])
    row = _row("recognised as their class")
    assert f"ratio {jem['samples']['ratio']:.2f}" in row and f"ratio {plain['samples']['ratio']:.2f}" in row, row
    row = _row("their spread within a class")
    assert f"{jem['samples']['spread']:.2f}" in row and f"{plain['samples']['spread']:.2f}" in row, row


def test_the_both_targets_row_is_the_recorded_digits_mixture_run():
    m = json.loads((RESULTS / "2026-11-28-digits-both-targets" / "digits_mixture" / "metrics.json").read_text())
    q, margins = m["sample_quality"], m["dequantised"]["margins"]
    row = _row("**`digits_mixture`**")
    shown = [
        f"{m['wall_time_s']:.0f} s",
        f"{q['classifier_ratio']:.2f}",
        f"{q['spread']:.2f}",
        f"{q['saturated_ratio']:.2f}×",
        f"{q['mid_grey_ratio']:.2f}×",
        f"{margins['gaussian']['margin']:+.2f} ± {margins['gaussian']['standard_error']:.2f}",
        f"{margins['gaussian_mixture']['margin']:+.2f} ± {margins['gaussian_mixture']['standard_error']:.2f}",
    ]
    assert all(s in row for s in shown) and m["dequantised"]["reliable"], (row, shown)
