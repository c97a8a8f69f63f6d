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
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_static.py"), "--networks", "2-32",
                           "--configs", "16x8", "64x4", "--capabilities", "90", "--kernels", "chain", "--precisions",
                           "tf32", "--workers", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["block_n"], r["warps"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(16, 8), (64, 4)}
    # 16 chains per warp fill a tensor-core tile; 2 per warp compute each tile's rows 8 times over (56 against 344)
    assert 0 < 4 * rows[(64, 4)]["per_chain_step"] < rows[(16, 8)]["per_chain_step"], rows
    assert "| chain | tf32 | 2-32-1 | 90 | 64×4 |" in done.stdout, done.stdout


def test_the_recorded_run_agrees_with_launch_config_and_the_pages_show_it():
    static = _module()
    rows = json.loads(RESULTS.with_suffix(".json").read_text())["rows"]
    chosen = static.chosen_against_least(rows)
    assert len(chosen) == 2 * 3 * len(static.NETWORKS) * 2  # kernels × products × networks × (sm_90, sm_80)
    for c in chosen:  # launch_config's choice was compiled, spills no more than allowed, and is near the least
        assert c["cost"] is not None and c["spill_stores"] <= c["allowance"], c
        assert c["ratio"] <= 2.1, c  # 2.04 at most: the smallest network, 2-32-1 (docs/cuda.md)
    # beyond 1.5 only for the smallest network, whose fixed work per step (the noise, the move) larger blocks share
    assert all(c["network"] == "2-32" for c in chosen if c["ratio"] > 1.5), [c for c in chosen if c["ratio"] > 1.5]
    two_layer = [c for c in chosen if c["network"] == "2-64-64" and c["capability"] == 90]
    assert max(c["ratio"] for c in two_layer) <= 1.15  # W4's and W5's network: 1.13 at most
    assert static.launch_table(rows) in (ROOT / "docs" / "cuda.md").read_text()
    assert static.summary(rows) in RESULTS.with_suffix(".md").read_text()
    # the command benchmarks/README.md shows prints those tables
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_static.py"), "--summary",
                           str(RESULTS.with_suffix(".json"))], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == static.summary(rows).strip(), done.stderr[-2000:]
