"""benchmarks/gpu.py on the CPU: G3's "eager vs compiled, same noise" compares two runs that draw the same noise
(the per-step loop, eager and through torch.compile), not the fused Philox path against torch noise."""

import importlib.util
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _gpu_script():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_g3_eager_and_compiled_draw_the_same_noise(monkeypatch):
    gpu = _gpu_script()
    # dynamo traces the transition as it does on a GPU; the eager backend skips inductor's C++ build (a minute here)
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="eager"))
    result = gpu.w4_same_noise(n=64, steps=3, device="cpu")
    assert result["max_abs_diff"] <= 1e-6, result
    for key in gpu.SAME_NOISE:
        assert result["paths"][key].startswith("per-step loop"), result["paths"]
    assert gpu.G3_VARIANTS["default"][0] == {}  # ebm's own path, timed beside them and compared in law only


def test_the_conv_pcd_rows_compare_a_captured_graph_with_the_per_step_loop(monkeypatch):
    """G3's conv PCD step at a tiny size, on the CPU with the torch backend (no fused conv chain) and a stand-in
    capture that replays by running the body: the default path is then a captured graph, and it draws what the
    per-step loop draws, so the first step's loss and gradient are equal."""
    import ebmcore
    from ebm_samplers import graphs

    def stand_in(body, generator, device):
        body()
        return body

    monkeypatch.setattr(graphs, "capture_for", lambda device: stand_in)
    gpu = _gpu_script()
    monkeypatch.setitem(gpu.CONV_PCD, "widths", (4, 8))
    monkeypatch.setitem(gpu.CONV_PCD, "batch", 8)
    monkeypatch.setitem(gpu.CONV_PCD, "buffer", 32)
    monkeypatch.setitem(gpu.CONV_PCD, "k", 12)
    with ebmcore.use_backend("torch"):
        recs = gpu.conv_pcd_rows("cpu", 1, lambda *a: None, inner=1)
    eager, default = recs
    assert eager["path"].startswith("per-step loop (fused=False)"), eager["path"]
    assert default["path"].startswith("CUDA graph, 10 transitions per launch"), default["path"]
    assert default["figures"]["loss_rel_diff_vs_eager"] == 0.0 and default["figures"]["grad_rel_diff_vs_eager"] == 0.0
    assert "speed-up vs eager" in gpu.g3_table(recs)


def _group_t(tmp_path, interpret: bool) -> dict:
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"OMP_NUM_THREADS": "1"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    out = tmp_path / "t.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu.py"),
            "--device",
            "cpu",
            "--quick",
            "--groups",
            "T",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"rows": json.loads(out.read_text())["triton"], "table": done.stdout}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (make setup installs it)")
def test_group_t_times_each_triton_configuration_beside_the_eager_loop_under_the_interpreter(tmp_path):
    """Group T (benchmarks/triton_sweep.py) at its dry sizes: the eager rows, then each configuration of both chains,
    with their correctness figures (the chains agree with the eager loop in law, and with each other's gradient)."""
    spec = importlib.util.spec_from_file_location("benchmarks_triton_sweep", ROOT / "benchmarks" / "triton_sweep.py")
    triton_sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(triton_sweep)
    got = _group_t(tmp_path, interpret=True)
    rows = got["rows"]
    assert not [r for r in rows if "skipped" in r], rows
    configs = triton_sweep.DRY["configs"]
    w4 = [r for r in rows if r["workload"] == "W4"]
    cd = [r for r in rows if r["workload"] == "W5 chain"]
    assert [r["variant"] for r in w4[:2]] == ["eager per-step loop, IEEE products", "eager per-step loop, TF32 products"]
    assert [(r["block_n"], r["num_warps"], r["precision"]) for r in w4[2:]] == configs
    assert [(r["block_n"], r["num_warps"], r["precision"]) for r in cd[1:]] == configs
    for r in w4[1:]:  # 40 chains: 5 standard errors is a loose bound, and these chains are seeded
        assert abs(r["figures"]["z_vs_eager"]) < 5 and r["figures"]["nonfinite_chains"] == 0, r
    # the same seed and stream: the configurations differ in the products' rounding only (bfloat16's, emulated)
    assert 1e-5 < cd[2]["figures"]["grad_rel_diff_vs_first"] < triton_sweep.GRADIENT_TOLERANCE["bf16"], cd[2]
    assert 0 < w4[3]["figures"]["max_abs_diff_vs_first"] < 1e-2, w4[3]
    assert "**FAIL**" not in got["table"] and "— (interpreted)" in got["table"]


def test_group_t_says_why_it_times_nothing_without_a_gpu_or_the_interpreter(tmp_path):
    rows = _group_t(tmp_path, interpret=False)["rows"]
    assert len(rows) == 1 and "TRITON_INTERPRET=1" in rows[0]["skipped"], rows
