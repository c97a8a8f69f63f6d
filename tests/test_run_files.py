"""What a run writes: JSON and samples renamed into place, plots only where matplotlib is installed."""

import json
import sys

import numpy as np
import torch

from ebmcore import plotting, runfiles


def test_json_and_samples_are_written_whole_and_read_back(tmp_path):
    runfiles.write_json(tmp_path / "m.json", {"x": torch.tensor([1.0, 2.0]), "n": np.int64(3), "nan": float("nan")})
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["x"] == [1.0, 2.0] and data["n"] == 3
    samples = torch.randn(5, 2, dtype=torch.bfloat16)
    runfiles.save_samples(tmp_path, "s", samples)
    assert torch.equal(torch.load(tmp_path / "s.pt", weights_only=True), samples)
    assert np.load(tmp_path / "s.npz")["samples"].dtype == np.float32  # numpy has no bfloat16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "s.npz", "s.pt"]  # no temporary left behind


def test_without_matplotlib_plotting_says_what_to_install(monkeypatch):
    assert plotting.unavailable() is None
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert "pip install 'ebmcore[plot]'" in plotting.unavailable()
