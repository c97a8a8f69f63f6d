"""Long runs stopped part-way: `ebm sample` and `ebm train`, killed in a subprocess with SIGINT or SIGKILL at a
chosen write, resume with --resume to exactly the result of an uninterrupted run, and no file is ever half-written.

The subprocess installs a hook on ``ebmcore.runfiles.write_bytes`` (every run file goes through it) that sends the
process the signal at the chosen point: before a given write (SIGINT: Python stops at the next instruction), or
with the temporary file of that write half on the disk (SIGKILL: the process dies at once, between two checkpoints).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ebmcore.cli import main

SAMPLE = """
[energy]
name = "gaussian_mixture"
params = { means = [[-1.0, 0.0], [1.0, 0.0]], stds = 0.8 }

[sampler]
name = "mala"
n_chains = 50
n_steps = 40
burn_in = 10
warmup = 10

[run]
checkpoint_every = 10

[output]
plots = false
"""

TRAIN = """
[data]
dataset = "two_moons"
n_train = 400
n_test = 100

[model]
energy = "mlp"
params = { dim = 2, hidden = [16, 16], seed = 0 }

[loss]
name = "denoising_score_matching"
params = { sigma = 0.2 }

[train]
steps = 40
batch_size = 32
eval_every = 10
checkpoint_every = 10

[output]
n_model_samples = 0
plots = false
"""

KILLER = """
import os, signal, sys
from pathlib import Path
from ebmcore import runfiles
from ebmcore.cli import main

signal.signal(signal.SIGINT, signal.default_int_handler)  # a job started in the background inherits SIGINT ignored
target, nth, signal_name = {target!r}, {nth!r}, {signal_name!r}
real = runfiles.write_bytes
seen = 0


def write_bytes(path, data):
    global seen
    seen += Path(path).name == target
    if Path(path).name == target and seen == nth:
        if signal_name == "SIGKILL":  # half of the temporary file is on the disk, then the process dies
            Path(path).with_name(Path(path).stem + ".tmp" + Path(path).suffix).write_bytes(bytes(data)[: len(data) // 2])
        os.kill(os.getpid(), getattr(signal, signal_name))
    real(path, data)


runfiles.write_bytes = write_bytes
sys.exit(main({argv!r}))
"""

# (job, configuration, the file whose n-th write is interrupted, n, what to compare): the sampler stops with two of
# its four segments checkpointed, the training with one of its four checkpoints written
JOBS = {
    "sample": (SAMPLE, "segment-00002.pt", 1, "samples.pt"),
    "train": (TRAIN, "checkpoint.pt", 2, "model.pt"),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted runs, once per module."""
    root = tmp_path_factory.mktemp("straight")
    for job, (text, *_) in JOBS.items():
        (root / f"{job}.toml").write_text(text)
        assert main([job, str(root / f"{job}.toml"), "--out", str(root / job), "--quiet"]) == 0
    return root


def _load(path):
    saved = torch.load(path, weights_only=True)
    return saved["state_dict"] if isinstance(saved, dict) else {"samples": saved}


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("job", ["sample", "train"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, straight, job, signal_name):
    text, target, nth, result = JOBS[job]
    config, out = tmp_path / f"{job}.toml", tmp_path / "run"
    config.write_text(text)
    argv = [job, str(config), "--out", str(out), "--quiet"]
    code = KILLER.format(target=target, nth=nth, signal_name=signal_name, argv=argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBM_")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True, text=True)
    if signal_name == "SIGINT":
        assert done.returncode == 130, done.stderr
        assert "interrupted: files already written are complete" in done.stderr and "Traceback" not in done.stderr
    else:
        assert done.returncode == -9, done.stderr
    assert not (out / "metrics.json").exists() and (out / "checkpoint.pt").exists()
    assert main(argv) == 2  # a checkpoint is there: the run needs --resume (or --overwrite)
    assert main(argv + ["--resume"]) == 0
    a, b = _load(straight / job / result), _load(out / result)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    if job == "sample":
        m, n = (json.loads((d / "metrics.json").read_text()) for d in (straight / job, out))
        assert (m["ess_bulk_min"], m["r_hat_max"], m["acceptance"]) == (n["ess_bulk_min"], n["r_hat_max"], n["acceptance"])
    assert [p.name for p in out.rglob("*") if ".tmp" in p.name] == []  # the resumed run replaced the half-written one
