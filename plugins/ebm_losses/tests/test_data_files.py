"""`ebm train` on data files it cannot use: one `error:` line naming the file and the fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ebmcore.cli import main
from ebmcore.errors import ConfigError, InputError, RunFileError
from ebm_losses import images, train_job


class PickledCode:
    """Unpickling this would call ``print``: weights-only loading must refuse it, not run it."""

    def __reduce__(self):
        return (print, ("this must never run",))


def _pngs(folder: Path, n: int) -> Path:
    from PIL import Image

    folder.mkdir()
    for i in range(n):
        Image.fromarray(np.full((6, 6), 40 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def _train(tmp_path: Path, dataset: Path, capsys) -> tuple[int, str]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[data]\ndataset = "{dataset}"\n[train]\nsteps = 1\n[output]\nplots = false\n')
    code = main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"])
    return code, capsys.readouterr().err


def test_a_corrupt_png_among_good_ones_is_named(tmp_path, capsys):
    folder = _pngs(tmp_path / "pngs", 6)
    (folder / "bad.png").write_bytes(b"not a png")
    code, err = _train(tmp_path, folder, capsys)
    assert code == 2 and "Traceback" not in err
    assert f"error: {folder / 'bad.png'} cannot be read as a PNG image (UnidentifiedImageError" in err
    assert "remove it from the folder, or export it again as a PNG" in err


def test_a_single_image_says_two_are_needed(tmp_path, capsys):
    code, err = _train(tmp_path, _pngs(tmp_path / "one", 1), capsys)
    assert code == 2 and "Traceback" not in err
    assert "error: 1 image(s): training needs at least 2, one to train on and one held out" in err


@pytest.mark.parametrize("n", [2, 4])
def test_two_to_four_images_hold_one_out(tmp_path, n):
    spec = {"dataset": str(_pngs(tmp_path / "few", n)), "pixel_range": [], "n_test": 2000, "n_train": 100, "seed": 0}
    train, test, _ = train_job._image_data(spec)
    assert len(test) == 1 and len(train) == n - 1


def test_a_pickle_payload_as_the_dataset_is_an_error_line(tmp_path, capsys):
    torch.save({"x": PickledCode()}, tmp_path / "x.pt")
    code, err = _train(tmp_path, tmp_path / "x.pt", capsys)
    assert code == 2 and "Traceback" not in err and "this must never run" not in capsys.readouterr().out
    assert f"error: {tmp_path / 'x.pt'} holds pickled Python objects, which ebm never loads" in err


def test_an_object_array_of_images_is_named_as_such(tmp_path, capsys):
    np.savez(tmp_path / "obj.npz", images=np.array([object(), 1], dtype=object))
    code, err = _train(tmp_path, tmp_path / "obj.npz", capsys)
    assert code == 2 and "Traceback" not in err and "has no array 'samples'" not in err
    assert f"error: {tmp_path / 'obj.npz'} holds object (pickled) arrays, which ebm never loads" in err
    assert "numpy.savez(path, images=images.astype('float32'))" in err


@pytest.mark.parametrize(
    "write, error, message",
    [
        (lambda p: np.savez(p, images=np.array([object()], dtype=object)), RunFileError, r"holds object \(pickled\) arrays"),
        (lambda p: p.write_bytes(b"PK\x03\x04 truncated"), RunFileError, r"cannot be read as an array of images"),
        (lambda p: np.savez(p, images=np.array(["a", "b"])), ConfigError, r"has dtype <U1, not numbers"),
    ],
)
def test_load_array_wraps_numpy_errors(tmp_path, write, error, message):
    path = tmp_path / "a.npz"
    write(path)
    with pytest.raises(error, match=message):
        images.load_array(path)


def test_load_array_refuses_a_pickle_payload(tmp_path):
    torch.save({"images": PickledCode()}, tmp_path / "a.pt")
    with pytest.raises(RunFileError, match=r"a\.pt holds pickled Python objects, which ebm never loads"):
        images.load_array(tmp_path / "a.pt")


def test_split_names_the_minimum():
    with pytest.raises(InputError, match=r"training needs at least 2"):
        images.split(torch.zeros(1, 1, 2, 2), 1, seed=0)


def test_a_png_too_large_for_pillow_is_named_with_its_size_and_the_fix(tmp_path, monkeypatch):
    """Issue 40: a 16000 × 12000 PNG raised Pillow's DecompressionBombError as a traceback; a low limit on 6 × 6
    images raises the same error."""
    from PIL import Image

    folder = _pngs(tmp_path / "pngs", 2)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 36 pixels > 2 × 10: Pillow's error, not its warning
    with pytest.raises(
        InputError,
        match=r"0\.png is too large to read: Image size \(36 pixels\) exceeds limit of 20 "
        r"pixels.*Downscale the image .*PIL\.Image\.MAX_IMAGE_PIXELS",
    ):
        images.load_png_folder(folder)
