"""`ebm train` end to end: files, metrics, plots, exact resume, validation; then `ebm sample` of the model."""

import json
import struct

import pytest
import torch

from ebmcore.cli import main

SMALL = """
[data]
dataset = "two_moons"
n_train = 600
n_test = 200

[model]
energy = "mlp"
params = { dim = 2, hidden = [32, 32], seed = 0 }

[loss]
name = "denoising_score_matching"
params = { sigma = 0.2 }

[train]
steps = 40
batch_size = 64
eval_every = 10
checkpoint_every = 10

[output]
n_model_samples = 300
"""


def _config(tmp_path, text=SMALL):
    path = tmp_path / "train.toml"
    path.write_text(text)
    return path


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200


def test_train_writes_model_metrics_and_plots_and_the_model_can_be_sampled(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(_config(tmp_path)), "--out", str(out), "--quiet"]) == 0
    assert "held-out NLL" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 40 and [s for s, _ in metrics["held_out_nll_history"]] == [10, 20, 30, 40]
    first = metrics["held_out_nll_history"][0][1]["held_out_nll"]
    assert metrics["held_out_nll"] < first + 0.5  # finite and not diverging
    for name in ("loss.png", "density.png", "landscape.png"):
        _png(out / name)
    assert torch.load(out / "samples.pt").shape == (300, 2)
    # every file a training writes loads without unpickling code (the model, the checkpoint, the samples)
    written = {path.name: torch.load(path, weights_only=True) for path in out.rglob("*.pt")}
    assert set(written) == {"model.pt", "checkpoint.pt", "samples.pt"} and written["model.pt"]["energy"] == "mlp"
    import numpy as np

    assert np.array_equal(np.load(out / "samples.npz", allow_pickle=False)["samples"], written["samples.pt"].numpy())
    sample_cfg = tmp_path / "sample.toml"
    sample_cfg.write_text(f'[energy]\nmodel = "{out / "model.pt"}"\n[sampler]\nname = "mala"\nn_chains = 100\nn_steps = 50\nburn_in = 20\nwarmup = 30\n[output]\nplots = false\n')
    assert main(["sample", str(sample_cfg), "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert json.loads((tmp_path / "s" / "metrics.json").read_text())["n_chains"] == 100


def test_resume_equals_the_uninterrupted_run(tmp_path):
    cfg = _config(tmp_path, SMALL.replace("n_model_samples = 300", "n_model_samples = 0\nplots = false"))
    assert main(["train", str(cfg), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", str(cfg), "--out", str(tmp_path / "b"), "--steps", "17", "--quiet"]) == 0
    assert main(["train", str(cfg), "--out", str(tmp_path / "b"), "--quiet"]) == 2  # exists: needs --resume
    assert main(["train", str(cfg), "--out", str(tmp_path / "b"), "--resume", "--quiet"]) == 0
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("text, message", [
    (SMALL.replace('dataset = "two_moons"', 'dataset = "moons"'), "key 'dataset' must be one of"),
    (SMALL.replace("steps = 40", "steps = -1"), "key 'steps' must be > 0"),
    (SMALL.replace('name = "denoising_score_matching"', 'name = "dsm"'), "no loss named 'dsm'"),
    (SMALL + "\n[extra]\na = 1\n", "unknown key(s) extra"),
])
def test_train_config_errors(tmp_path, capsys, text, message):
    assert main(["train", str(_config(tmp_path, text)), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert message in capsys.readouterr().err
