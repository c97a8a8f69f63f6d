"""benchmarks/triton_static.py: the Triton chains' launch configurations costed from their machine code, without a GPU.

The script runs on a small grid (two compiles); the recorded run that chose ``launch_config`` still agrees with it, and
the tables of its results page and of docs/cuda.md are that run's."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "2026-11-26-triton-static"


def _module():
    spec = importlib.util.spec_from_file_location("benchmarks_triton_static", ROOT / "benchmarks" / "triton_static.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_grid_compiles_counts_and_ranks(tmp_path):
    pytest.importorskip("triton", reason="the compiles need triton (the README's test set-up installs it)")
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "triton_static.py"),
            "--networks",
            "2-32",
            "--configs",
            "16x8",
            "128x4",
            "--capabilities",
            "90",
            "--kernels",
            "chain",
            "--precisions",
            "tf32",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["block_n"], r["warps"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(16, 8), (128, 4)}
    # 32 chains per warp, two tensor-core tiles' rows; 2 per warp compute each tile's rows 8 times over (23 against 268)
    assert 0 < 4 * rows[(128, 4)]["per_chain_step"] < rows[(16, 8)]["per_chain_step"], rows
    assert "| chain | tf32 | 2-32-1 | 90 | 128×4 | 23 | 0 | 23 (128×4) | 1.00 |" in done.stdout, done.stdout


def test_the_recorded_run_agrees_with_launch_config_and_the_pages_show_it():
    static = _module()
    rows = json.loads(RESULTS.with_suffix(".json").read_text())["rows"]
    chosen = static.chosen_against_least(rows)
    assert len(chosen) == 2 * 3 * len(static.NETWORKS) * 2  # kernels × products × networks × (sm_90, sm_80)
    for c in chosen:  # launch_config's choice was compiled, spills at most 64 bytes, and is near the least
        assert c["cost"] is not None and c["ratio"] <= 1.4, c  # 1.36 at most (docs/cuda.md)
        if c["spill_stores"] > static.SPILL_ALLOWANCE:  # one choice spills more: 72 bytes, for 2.6 times fewer
            # instructions than the least that spills 64 or fewer
            assert (c["kernel"], c["precision"], c["network"], c["capability"]) == ("chain", "tf32", "2-64-64-64", 90), c
            assert c["spill_stores"] <= 72 and 2.5 * c["cost"] < min(
                r["per_chain_step"]
                for r in rows
                if r.get("per_chain_step")
                and r["spill_stores"] <= static.SPILL_ALLOWANCE
                and (r["kernel"], r["precision"], r["network"], r["capability"]) == ("chain", "tf32", "2-64-64-64", 90)
            )
    # beyond 1.16 only for the ragged network (3-40-17-5-1, padded to 16-64-32-16); 2-32-1 at the least on both GPUs
    assert all(c["network"] == "3-40-17-5" for c in chosen if c["ratio"] > 1.16), [c for c in chosen if c["ratio"] > 1.16]
    assert all(c["ratio"] == 1.0 for c in chosen if c["network"] == "2-32")
    two_layer = [c for c in chosen if c["network"] == "2-64-64"]
    assert max(c["ratio"] for c in two_layer) <= 1.16  # W4's and W5's network: 1.16 at most
    assert static.launch_table(rows) in (ROOT / "docs" / "cuda.md").read_text()
    assert static.summary(rows) in RESULTS.with_suffix(".md").read_text()
    # the command benchmarks/README.md shows prints those tables
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "triton_static.py"), "--summary", str(RESULTS.with_suffix(".json"))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0 and done.stdout.strip() == static.summary(rows).strip(), done.stderr[-2000:]
