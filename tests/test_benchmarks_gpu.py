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
