"""`ebm sample`'s live log: a row per streamed chunk or checkpointed segment with that part's own diagnostics, kept and
continued without duplicates by --resume, TensorBoard events read back, and clear errors where it cannot apply."""

import csv
import json
import math
import sys

import numpy as np
import pytest

from ebmcore.cli import main

CONFIG = """
[energy]
name = "gaussian"
params = { dim = 2 }

[sampler]
name = "mala"
n_chains = 40
n_steps = 30
burn_in = 10
warmup = 20

[output]
plots = false
"""


def _config(tmp_path, run="", output="live_log = true"):
    path = tmp_path / "sample.toml"
    path.write_text(CONFIG + output + "\n[run]\n" + run + "\n")
    return path


def _rows(out):
    with open(out / "log.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_a_stream_logs_each_chunk_and_a_resume_logs_only_the_chunks_it_draws(tmp_path):
    cfg = _config(tmp_path, "n_samples = 100\nchunk_size = 40")
    out = tmp_path / "stream"
    args = ["sample", str(cfg), "--out", str(out), "--quiet"]
    assert main(args) == 0
    rows = _rows(out)
    assert [r["chunk"] for r in rows] == ["0", "1", "2"]
    assert [int(r["n_chains"]) for r in rows] == [40, 40, 20] and {r["steps"] for r in rows} == {"40"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert {float(r["step_size"]) for r in rows} == {metrics["step_size"]}
    chains = [int(r["n_chains"]) for r in rows]  # the run's acceptance is the chunks' mean
    assert np.mean([float(r["acceptance"]) for r in rows]) == pytest.approx(metrics["acceptance"], rel=1e-6)
    assert sum(chains) == 100 and all(0 < float(r["acceptance"]) < 1 for r in rows)
    for row in rows:  # a 2-d standard Gaussian: E = |x|²/2 has mean 1 (+ log 2π)
        assert math.isfinite(float(row["energy_mean"])) and row["divergences"] == "0" and row["nonfinite_chains"] == "0"
    (out / "chunks" / "chunk-00001.npz").unlink()
    (out / "chunks" / "chunk-00002.npz").unlink()
    assert main(args + ["--resume"]) == 0
    resumed = _rows(out)
    assert [r["chunk"] for r in resumed] == ["0", "1", "2"]  # chunk 0 kept, 1 and 2 drawn again: one row each
    assert resumed[0] == rows[0] and resumed[1]["wall_time"] != rows[1]["wall_time"]
    assert [r["energy_mean"] for r in resumed] == [r["energy_mean"] for r in rows]  # each chunk redrawn alike


def test_a_checkpointed_run_logs_each_segment_and_resumes_the_rows_exactly(tmp_path, monkeypatch):
    from ebm_samplers import sample_job

    cfg = _config(tmp_path, "checkpoint_every = 10")
    assert main(["sample", str(cfg), "--out", str(tmp_path / "straight"), "--quiet"]) == 0

    def interrupt(index):
        if index == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(sample_job, "_after_segment", interrupt)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--quiet"]) == 130
    assert [r["segment"] for r in _rows(tmp_path / "cut")] == ["0", "1"]
    monkeypatch.setattr(sample_job, "_after_segment", lambda index: None)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "cut"), "--resume", "--quiet"]) == 0
    straight, cut = _rows(tmp_path / "straight"), _rows(tmp_path / "cut")
    assert [r["segment"] for r in cut] == ["0", "1", "2"]
    assert [int(r["steps"]) for r in cut] == [20, 10, 10]  # the first segment runs the burn-in too
    for column in ("acceptance", "energy_mean", "divergences", "step_size"):  # the resumed run is the straight one
        assert [r[column] for r in cut] == [r[column] for r in straight], column


def test_tensorboard_events_hold_each_chunk_s_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    cfg = _config(tmp_path, "n_samples = 80\nchunk_size = 40", "live_log = { tensorboard = true }")
    assert main(["sample", str(cfg), "--out", str(out), "--quiet"]) == 0
    events = EventAccumulator(str(out))
    events.Reload()
    rows = _rows(out)
    for column in ("acceptance", "energy_mean", "step_size", "divergences", "nonfinite_chains"):
        logged = events.Scalars(f"sample/{column}")
        assert [e.step for e in logged] == [0, 1]
        assert [e.value for e in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-6)


@pytest.mark.parametrize(
    "run, output, message",
    [
        ("", "live_log = true", "a run in one call has neither; set [run] n_samples (streaming) or checkpoint_every"),
        ("n_samples = 10", "live_log = { every = 5 }", "unknown key(s) every (the keys are tensorboard)"),
        ("n_samples = 10", "live_log = { tensorboard = 1 }", "must have tensorboard = true or false"),
    ],
)
def test_a_live_log_that_cannot_apply_is_a_config_error(tmp_path, capsys, run, output, message):
    cfg = _config(tmp_path, run, output)
    assert main(["sample", str(cfg), "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_tensorboard_asked_for_and_missing_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    cfg = _config(tmp_path, "n_samples = 10", "live_log = { tensorboard = true }")
    assert main(["sample", str(cfg), "--out", str(tmp_path / "x"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "[output]: key 'live_log' sets tensorboard = true" in err and "pip install 'ebm-samplers[tensorboard]'" in err
