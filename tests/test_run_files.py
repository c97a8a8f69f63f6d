"""What a run writes: JSON, samples, checkpoints and plots written whole (temporary name, fsync, rename) or not at all,
with an error naming the path on a full disk or a read-only directory; files read back with errors naming the fix."""

import ast
import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ebmcore import plotting, runfiles
from ebmcore.errors import RunFileError


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


def _no_temporaries(directory):
    return [p.name for p in directory.rglob("*") if ".tmp" in p.name] == []


def test_a_full_disk_is_an_error_naming_the_path_and_earlier_files_stay_whole(tmp_path, monkeypatch):
    runfiles.write_json(tmp_path / "metrics.json", {"a": 1})
    runfiles.save_samples(tmp_path, "samples", torch.arange(6.0).reshape(3, 2))
    real = runfiles._write

    def full(tmp, data):
        with open(tmp, "wb") as f:  # half the bytes reach the disk, then it is full
            f.write(bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfiles, "_write", full)
    with pytest.raises(RunFileError) as err:
        runfiles.write_json(tmp_path / "metrics.json", {"a": 2})
    assert "metrics.json" in str(err.value) and "No space left" in str(err.value) and "free some space" in str(err.value)
    with pytest.raises(RunFileError, match=r"samples\.pt"):
        runfiles.save_samples(tmp_path, "samples", torch.zeros(3, 2))
    monkeypatch.setattr(runfiles, "_write", real)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"a": 1}  # the earlier file, whole
    assert torch.equal(torch.load(tmp_path / "samples.pt", weights_only=True), torch.arange(6.0).reshape(3, 2))
    assert _no_temporaries(tmp_path)


def _read_only(directory, monkeypatch):
    """Make ``directory`` read-only: chmod where that binds (not as root), else the write fails as it would."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return
    real = runfiles._write

    def refused(tmp, data):
        if tmp.parent == directory:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp))
        real(tmp, data)

    monkeypatch.setattr(runfiles, "_write", refused)


def test_a_read_only_directory_is_an_error_naming_the_path(tmp_path, monkeypatch):
    runfiles.write_json(tmp_path / "config.json", {"a": 1})
    _read_only(tmp_path, monkeypatch)
    try:
        with pytest.raises(RunFileError) as err:
            runfiles.save_torch({"x": torch.zeros(2)}, tmp_path / "checkpoint.pt")
    finally:
        tmp_path.chmod(0o755)
    assert "checkpoint.pt" in str(err.value) and "Permission denied" in str(err.value)
    assert f"make {tmp_path} writable" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_a_truncated_or_missing_file_is_an_error_naming_it_and_the_fix(tmp_path):
    runfiles.save_torch({"x": torch.zeros(100)}, tmp_path / "checkpoint.pt")
    data = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(RunFileError, match=r"checkpoint\.pt cannot be read as a checkpoint .*truncated.*start again"):
        runfiles.load_torch(tmp_path / "checkpoint.pt", what="a checkpoint", fix="start again")
    with pytest.raises(RunFileError, match=r"segment-00001\.pt: no such file \(expected a segment\); start again"):
        runfiles.load_torch(tmp_path / "segment-00001.pt", what="a segment", fix="start again")


def test_plots_are_written_atomically(tmp_path, monkeypatch):
    steps, values = list(range(10)), [float(v) for v in range(10)]
    plotting.plot_curve(tmp_path / "loss.png", steps, values, "t", "y")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def full(tmp, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfiles, "_write", full)
    with pytest.raises(RunFileError, match=r"loss\.png"):
        plotting.plot_curve(tmp_path / "loss.png", steps, values, "t", "y")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and _no_temporaries(tmp_path)


def test_every_run_file_is_written_through_runfiles():
    """torch.save, numpy's savez, savefig, write_text/write_bytes and open(..., "w") of a path are called only in
    runfiles.py (and in the test helpers, the CUDA plugin's kernel cache and the Triton compile report's temporary PTX
    and cubin, which are no run files, and the live log, appended a row at a time so that ``tail -f`` follows it);
    writing to an in-memory ``buffer``, or through ``runfiles`` itself, is fine."""
    root = Path(__file__).resolve().parents[1]
    allowed = {
        "ebmcore/runfiles.py",
        "ebmcore/testing/plugins.py",
        "plugins/ebm_cuda/ebm_cuda/build.py",
        "plugins/ebm_cuda/ebm_cuda/kernel_report.py",
        "plugins/ebm_samplers/ebm_samplers/live_log.py",
    }
    writers = {"save", "savez", "savez_compressed", "savefig", "write_text", "write_bytes"}

    def writes(call):
        name = getattr(call.func, "attr", getattr(call.func, "id", ""))
        to_buffer = bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == "buffer"
        if name == "open":
            mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
            return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax")
        if name in ("save", "savez", "savez_compressed"):
            return not to_buffer and getattr(getattr(call.func, "value", None), "id", "") in ("torch", "np", "numpy")
        through_runfiles = isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "runfiles"
        return name in writers and isinstance(call.func, ast.Attribute) and not to_buffer and not through_runfiles

    sources = [*root.glob("ebmcore/**/*.py"), *root.glob("plugins/*/ebm_*/**/*.py")]
    found = [
        f"{p.relative_to(root)}:{node.lineno}"
        for p in sources
        if p.relative_to(root).as_posix() not in allowed
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call) and writes(node)
    ]
    assert len(sources) > 40 and found == []


def test_a_job_reuses_a_finished_run_clears_it_under_overwrite_and_refuses_both_flags(tmp_path, caplog):
    from ebmcore.errors import ConfigError

    config = {"a": 1}
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="--resume continues the run in the directory and --overwrite starts it afresh"):
        runfiles.reuse_or_clear(out, config, lambda m: [], resume=True, overwrite=True, what="run", again="run it again")
    assert runfiles.reuse_or_clear(out, config, lambda m: [], resume=False, overwrite=False, what="run", again="x") is None
    out.mkdir()
    runfiles.start_run(out, config)
    runfiles.write_json(out / "metrics.json", {"done": True})
    with caplog.at_level("INFO", logger="ebmcore.runfiles"):
        assert runfiles.reuse_or_clear(
            out, config, lambda m: [], resume=False, overwrite=False, what="training", again="train again"
        ) == {"done": True}
    assert (
        "holds a finished training of this configuration, summarised below: nothing to do (pass --overwrite to train "
        "again, or choose another --out)." in caplog.text
    )
    assert runfiles.reuse_or_clear(out, {"a": 2}, lambda m: [], resume=False, overwrite=False, what="run", again="x") is None
    assert runfiles.reuse_or_clear(out, config, lambda m: [], resume=False, overwrite=True, what="run", again="x") is None
    assert not (out / "metrics.json").exists()  # cleared: a later run cannot be taken for this one
    (tmp_path / "file").write_text("")
    with pytest.raises(RunFileError, match="is an existing file"):
        runfiles.reuse_or_clear(tmp_path / "file", config, lambda m: [], resume=False, overwrite=False, what="run", again="x")
