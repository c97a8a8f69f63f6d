"""benchmarks/gpu.py on the CPU: G3's "eager vs compiled, same noise" compares two runs that draw the same noise
(the per-step loop, eager and through torch.compile), not the fused Philox path against torch noise."""

import importlib.util
import sys
from functools import partial
from pathlib import Path

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
