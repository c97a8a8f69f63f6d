"""Files ebm sample reads back that are not what it wrote (an object array in a chunk, a foreign draws.npz): one
error naming the file and the fix, never numpy's or pickle's traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ebmcore.cli import main
from ebmcore.errors import RunFileError
from ebm_samplers.draws import load_npz

from test_sample_job import _config


def test_resuming_over_a_chunk_holding_an_object_array_is_an_error_line(tmp_path, capsys):
    cfg = _config(tmp_path, "langevin", warmup=0, plots="false")
    out = tmp_path / "stream"
    args = ["sample", str(cfg), "--out", str(out), "--n-samples", "30", "--chunk-size", "10", "--quiet"]
    assert main(args) == 0
    np.savez(out / "chunks" / "chunk-00000.npz", samples=np.array([object(), 1], dtype=object))
    (out / "chunks" / "chunk-00002.npz").unlink()
    capsys.readouterr()
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"error: {out / 'chunks' / 'chunk-00000.npz'} holds object (pickled) arrays, which ebm never loads" in err
    assert "delete it, and --resume draws that chunk again" in err


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: np.savez(p, x=np.array([object()], dtype=object), attrs=np.array("{}")), r"holds object \(pickled\) arrays"),
        (lambda p: p.write_bytes(b"not an npz"), r"cannot be read as the draws of ebm sample"),
        (lambda p: np.savez(p, samples=np.zeros((2, 2))), r"has no array 'x', 'attrs' \(it holds samples"),
        (lambda p: np.savez(p, x=np.zeros((2, 2)), attrs=np.array("{not json")), r"does not hold ebm's draws \(JSONDecodeError"),
    ],
)
def test_load_npz_names_a_file_that_is_not_draws(tmp_path, write, message):
    path = tmp_path / "draws.npz"
    write(path)
    with pytest.raises(RunFileError, match=message):
        load_npz(path)


def test_load_npz_reads_back_what_ebm_sample_wrote(tmp_path):
    cfg = _config(tmp_path, "mala", warmup=0, plots="false")
    assert main(["sample", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    draws = load_npz(tmp_path / "o" / "draws.npz")
    assert draws.x.dim() == 3 and "acceptance_rate" in draws.stats
    assert draws.attrs == json.loads(json.dumps(draws.attrs))
