"""Distributed sampling on gloo with 2 and 4 processes (torchrun): reduced diagnostics, reproducibility,
distinct streams, statistics of the gathered chains, and a failing rank that errors instead of hanging."""

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ebmcore import diagnostics
from ebmcore.distributed import shard

SCRIPT = Path(__file__).with_name("dist_sample_script.py")


def _torchrun(n, mode, out, timeout=120):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", str(SCRIPT), mode, str(out)]
    start = time.perf_counter()
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    )
    return done, time.perf_counter() - start


def test_shards_cover_every_chain_once():
    for n, world in [(10, 3), (3001, 4), (2, 4)]:
        rows = [shard(n, r, world) for r in range(world)]
        assert rows[0].start == 0 and rows[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(rows, rows[1:]))
        assert max(r.stop - r.start for r in rows) - min(r.stop - r.start for r in rows) <= 1


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_sampling_reduces_and_gathers_correctly(tmp_path, world):
    done, _ = _torchrun(world, "sample", tmp_path / "a.pt")
    assert done.returncode == 0, done.stderr[-2000:]
    a = torch.load(tmp_path / "a.pt", weights_only=False)
    assert a["samples"].shape == (3001, 3) and a["trajectory"].shape == (60, 3001, 3)
    # diagnostics reduced across ranks equal those of the gathered chains computed in one process
    local = diagnostics.summary(a["trajectory"])
    for key in ("ess_bulk", "ess_tail", "r_hat", "mean"):
        torch.testing.assert_close(a["summary"][key], local[key])
    assert 0.3 < a["acceptance"] < 1 and a["divergences"] == 0
    # per-draw statistics gathered in the chains' order: each energy is that of its draw
    stats = a["stats"]
    assert {k: v.shape for k, v in stats.items()} == {k: (60, 3001) for k in ("energy", "acceptance", "divergent")}
    mean = torch.tensor([1.0, -1.0, 0.5])
    torch.testing.assert_close(stats["energy"], 0.5 * ((a["trajectory"] - mean) ** 2).sum(-1))
    assert stats["divergent"].dtype == torch.bool and not stats["divergent"].any()
    assert abs(float(stats["acceptance"].mean()) - a["acceptance"]) < 0.02
    # the gathered chains sample the target: mean within 5 standard errors
    err = (a["samples"].double().mean(0) - torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)).abs().max()
    assert err < 5 / math.sqrt(3001)
    # reproducible for a given seed and world size
    done, _ = _torchrun(world, "sample", tmp_path / "b.pt")
    assert done.returncode == 0
    assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=False)["samples"], a["samples"])


def test_ranks_draw_distinct_streams(tmp_path):
    done, _ = _torchrun(2, "noise", tmp_path / "n.pt")
    assert done.returncode == 0, done.stderr[-2000:]
    x = torch.load(tmp_path / "n.pt", weights_only=False)["samples"]
    rank0, rank1 = x[:8], x[8:]
    assert not torch.equal(rank0, rank1)
    assert len({tuple(row.tolist()) for row in x}) == 16  # no two chains share a draw


def test_a_failing_rank_is_an_error_everywhere_not_a_hang(tmp_path):
    done, elapsed = _torchrun(2, "fail", tmp_path / "f.pt")
    assert done.returncode != 0 and elapsed < 90
    assert "rank 1 fails on purpose" in done.stderr + done.stdout


def _ebm_sample_under_torchrun(cfg, out):
    import os

    ebm = Path(sys.executable).with_name("ebm")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(ebm),
            "sample",
            str(cfg),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_ebm_sample_runs_unchanged_under_torchrun(tmp_path):
    import json

    cfg = tmp_path / "s.toml"
    cfg.write_text(
        '[energy]\nname = "gaussian"\nparams = { dim = 2 }\n[sampler]\nname = "mala"\nn_chains = 301\n'
        'n_steps = 40\nburn_in = 20\nwarmup = 20\n[output]\nplots = false\n'
    )
    _ebm_sample_under_torchrun(cfg, tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["n_chains"] == 301 and metrics["r_hat_max"] < 1.1
    assert torch.load(tmp_path / "run" / "samples.pt").shape == (301, 2)


def test_per_rank_sample_files(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        '[energy]\nname = "gaussian"\nparams = { dim = 2 }\n[sampler]\nname = "langevin"\nn_chains = 101\n'
        'n_steps = 10\nburn_in = 0\n[output]\nplots = false\nper_rank_samples = true\n'
    )
    _ebm_sample_under_torchrun(cfg, tmp_path / "run")
    shards = [torch.load(tmp_path / "run" / f"samples-rank{r}.pt") for r in (0, 1)]
    assert [s.shape[0] for s in shards] == [51, 50] and not (tmp_path / "run" / "samples.pt").exists()
