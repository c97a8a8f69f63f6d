"""Images end to end: the loaders and their range, `ebm train digits` (shortened), exact resume with the replay
buffer, gradient clipping; the full bundled run is behind the ``slow`` marker."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from ebmcore.cli import main
from ebmcore.errors import ConfigError, InputError
from ebm_losses import images, train_job
from ebm_losses.training import Trainer
from loss_problems import shortened_config


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_arrays_pngs_and_digits_load_as_nchw_with_their_pixel_range(tmp_path):
    raw = np.arange(5 * 6 * 7, dtype=np.uint8).reshape(5, 6, 7)
    np.savez(tmp_path / "a.npz", images=raw)
    loaded = images.load(str(tmp_path / "a.npz"))
    assert loaded.images.shape == (5, 1, 6, 7) and loaded.pixel_range == (0.0, 255.0)
    assert torch.equal(loaded.images[:, 0], torch.from_numpy(raw).float())
    torch.save({"images": torch.rand(4, 3, 5, 5)}, tmp_path / "b.pt")
    assert images.load(str(tmp_path / "b.pt")).images.shape == (4, 3, 5, 5)
    assert images.load(str(tmp_path / "b.pt")).pixel_range == (0.0, 1.0)
    np.savez(tmp_path / "hwc.npz", np.zeros((4, 5, 6, 3), dtype=np.uint8))  # channels last, its only array
    assert images.load(str(tmp_path / "hwc.npz")).images.shape == (4, 3, 5, 6)
    from PIL import Image

    folder = tmp_path / "pngs"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(raw[i]).save(folder / f"{i}.png")
    pngs = images.load(str(folder))
    assert pngs.images.shape == (3, 1, 6, 7) and torch.equal(pngs.images, loaded.images[:3])
    digits = images.load("digits")
    assert digits.images.shape == (1797, 1, 8, 8) and digits.pixel_range == (0.0, 16.0)
    assert float(digits.images.max()) == 16.0 and digits.labels.shape == (1797,)
    assert images.is_image_source("digits") and images.is_image_source(str(folder))
    assert not images.is_image_source("two_moons")


def test_model_range_is_minus_one_to_one_and_its_inverse_restores_pixels():
    x = torch.tensor([0.0, 4.0, 16.0])
    y = images.to_model_range(x, (0.0, 16.0))
    torch.testing.assert_close(y, torch.tensor([-1.0, -0.5, 1.0]))
    torch.testing.assert_close(images.to_pixel_range(y, (0.0, 16.0)), x)


def test_split_is_seeded_disjoint_and_complete():
    x = torch.arange(50.0)
    train, test = images.split(x, 10, seed=3)
    again, _ = images.split(x, 10, seed=3)
    assert torch.equal(train, again) and len(test) == 10
    assert sorted(torch.cat([train, test]).tolist()) == x.tolist()
    assert not torch.equal(images.split(x, 10, seed=4)[1], test)


def test_bad_image_sources_say_what_to_do(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no .png files"):
        images.load(str(tmp_path / "empty"))
    np.savez(tmp_path / "two.npz", a=np.zeros((2, 4, 4)), b=np.zeros((2, 4, 4)))
    with pytest.raises(ConfigError, match=r"no array under images / x / data / samples"):
        images.load(str(tmp_path / "two.npz"))


def _png(path: Path, pixels: np.ndarray, color_type: int) -> None:
    """A 16-bit PNG written by hand (Pillow writes no 16-bit colour PNG): ``color_type`` 0 grey, 2 RGB."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    h, w = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[i].astype(">u2").tobytes() for i in range(h))
    header = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_16_bit_pngs_keep_their_precision_on_the_range_of_8_bit_ones(tmp_path):
    raw = (np.arange(3 * 6 * 7).reshape(3, 6, 7) * 500).astype(np.uint16)  # 0–62,500: 126 distinct values
    folder = tmp_path / "png16"
    folder.mkdir()
    for i in range(3):
        _png(folder / f"{i}.png", raw[i], color_type=0)
    loaded = images.load(str(folder))
    assert loaded.pixel_range == (0.0, 65535.0) and torch.equal(loaded.images[:, 0], torch.from_numpy(raw).float())
    x = images.to_model_range(loaded.images, loaded.pixel_range)
    assert x.unique().numel() == 126 and float(x.min()) == -1.0 and 0.9 < float(x.max()) <= 1.0
    np.savez(tmp_path / "u16.npz", images=raw)  # the same pixels as a uint16 array: the same range
    assert images.load(str(tmp_path / "u16.npz")).pixel_range == (0.0, 65535.0)
    _png(folder / "3.png", np.zeros((6, 7, 3), dtype=np.uint16), color_type=2)
    with pytest.raises(InputError, match=r"3\.png is a 16-bit colour PNG .*which Pillow reads as 8 bits.*numpy\.savez"):
        images.load(str(folder))


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_complex_images_are_an_error_naming_the_array(tmp_path, suffix):
    values = (np.ones((4, 6, 6)) + 1j).astype(np.complex64)
    path = tmp_path / f"c{suffix}"
    np.savez(path, images=values) if suffix == ".npz" else torch.save({"images": torch.from_numpy(values)}, path)
    with pytest.raises(
        InputError,
        match=r"c\.(npz: the array|pt: the tensor) 'images' is complex \(torch\.complex64\); "
        r"images must be real numbers\. Save .*numpy\.abs\(a\)",
    ):
        images.load(str(path))


def _short_digits(tmp_path: Path, steps: int = 4) -> Path:
    """The bundled digits configuration, shortened to seconds."""
    changes = [
        ("n_steps = 20", "n_steps = 3"),
        ("buffer_size = 2000", "buffer_size = 200"),
        (f"steps = {train_job.load_config('digits')['train']['steps']}", f"steps = {steps}"),
        ("widths = [32, 64]", "widths = [8, 16]"),
        ("image_sample_steps = ", "image_sample_steps = 5 #"),
        ("ais_chains = ", "ais_chains = 16 #"),
        ("ais_temperatures = ", "ais_temperatures = 20 #"),
        ("checkpoint_every = 250", "checkpoint_every = 2"),
        ("eval_every = 250", "eval_every = 2"),
    ]
    return shortened_config("digits", changes, tmp_path / "digits.toml")


def test_train_digits_writes_grids_histograms_losses_and_metrics(tmp_path, capsys):
    assert train_job.load_config("digits")["data"]["dataset"] == "digits"  # `ebm train digits` is the bundled file
    out = tmp_path / "run"
    assert main(["train", str(_short_digits(tmp_path)), "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["image_shape"] == [1, 8, 8] and metrics["pixel_range"] == [0.0, 16.0]
    assert metrics["negatives"]["samples_model_density"] is False and "noise_scale" in metrics["negatives"]["why_not"]
    ais = metrics["ais"]
    assert ais["log_z"]["n_chains"] == 16 and ais["log_z"]["n_temperatures"] == 20
    assert ais["test_log_likelihood"] == pytest.approx(ais["test_log_likelihood_per_dim"] * 64)
    quality = metrics["sample_quality"]
    assert sum(quality["nearest_train_class_counts"]) == 100 and 1 <= quality["classes_covered"] <= 10
    for name in ("samples.png", "buffer.png", "data.png", "energy_histogram.png", "loss.png"):
        width, height = _png_size(out / name)
        assert width > 300 and height > 200, name
    samples = torch.load(out / "samples.pt")
    assert samples.shape == (100, 1, 8, 8)  # on the pixel range: the inverse of [-1, 1]
    assert "trained to step 4" in capsys.readouterr().out


def test_image_resume_restores_the_replay_buffer_exactly(tmp_path):
    config = _short_digits(tmp_path, steps=4)
    text = config.read_text().replace("plots = true", "plots = false").replace("ais_chains = 16", "ais_chains = 0")
    config.write_text(text)
    assert main(["train", str(config), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", str(config), "--out", str(tmp_path / "b"), "--steps", "2", "--quiet"]) == 0
    assert main(["train", str(config), "--out", str(tmp_path / "b"), "--resume", "--quiet"]) == 0
    a, b = (torch.load(tmp_path / name / "checkpoint.pt", weights_only=True) for name in "ab")
    assert torch.equal(a["loss"]["buffer"], b["loss"]["buffer"])
    for key in a["energy"]:
        assert torch.equal(a["energy"][key], b["energy"][key]), key


def test_clip_grad_norm_bounds_every_update():
    from ebmcore import GaussianEnergy
    from ebm_losses import DenoisingScoreMatching

    energy = GaussianEnergy(torch.zeros(2), covariance=torch.eye(2))
    energy.mean.requires_grad_(True)
    before = energy.mean.detach().clone()
    trainer = Trainer(
        energy,
        DenoisingScoreMatching(sigma=0.1),
        torch.randn(64, 2) + 5.0,
        batch_size=64,
        optimizer=torch.optim.SGD([energy.mean], lr=1.0),
        clip_grad_norm=1e-3,
    )
    trainer.fit(1)
    assert 0 < float((energy.mean.detach() - before).norm()) <= 1e-3 + 1e-9


@pytest.mark.slow
def test_the_bundled_digits_run_learns_digits_of_several_classes(tmp_path):
    """The full `ebm train digits` (a few minutes on 2 cores): samples cover most classes and lie near the data."""
    out = tmp_path / "digits"
    assert main(["train", "digits", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    quality = metrics["sample_quality"]
    assert quality["classes_covered"] >= 6
    assert max(quality["nearest_train_class_counts"]) < 0.5 * sum(quality["nearest_train_class_counts"])
    assert quality["nearest_train_rms_samples"] < 2 * quality["nearest_train_rms_test"]


def test_ais_log_likelihood_matches_the_exact_gaussian_log_density():
    """``ais_log_likelihood`` (the figure `ebm train` reports): for an unnormalised Gaussian energy the held-out
    ``mean log p`` is known exactly; the base is the training data's Gaussian fit."""
    from ebmcore import GaussianEnergy
    from ebm_losses.image_report import ais_log_likelihood

    cov = torch.tensor([[1.0, 0.6], [0.6, 2.0]], dtype=torch.float64)
    energy = GaussianEnergy(torch.tensor([1.0, -1.0], dtype=torch.float64), covariance=cov)
    law = torch.distributions.MultivariateNormal(energy.mean, cov)
    g = torch.Generator().manual_seed(0)
    draws = energy.mean + torch.randn(2500, 2, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    train, test = draws[:2000], draws[2000:]
    report = ais_log_likelihood(energy, train, test, n_chains=256, n_temperatures=100, seed=0)
    exact = float(law.log_prob(test).mean())
    assert report["reliable"] and abs(report["test_log_likelihood"] - exact) < 4 * report["standard_error"] + 1e-3
    assert report["test_log_likelihood_per_dim"] == pytest.approx(report["test_log_likelihood"] / 2)


def _cifar_file(path: Path, labels: list[int], seed: int) -> np.ndarray:
    """A file in CIFAR-10's binary format (a label byte, 3,072 pixel bytes per record); returns the pixels (N, 3, 32, 32)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(len(labels), 3, 32, 32), dtype=np.uint8)
    records = np.concatenate([np.array(labels, dtype=np.uint8)[:, None], pixels.reshape(len(labels), -1)], axis=1)
    path.write_bytes(records.tobytes())
    return pixels


def test_cifar10_binary_batches_are_read_as_bytes_record_by_record(tmp_path):
    folder = tmp_path / images.CIFAR_FOLDER
    folder.mkdir()
    first = _cifar_file(folder / "data_batch_1.bin", [3, 9, 0], seed=1)
    second = _cifar_file(folder / "data_batch_2.bin", [7, 1], seed=2)
    _cifar_file(folder / "test_batch.bin", [5], seed=3)  # not read: the held-out split comes from the training batches
    loaded = images.load(str(folder))
    assert loaded.images.shape == (5, 3, 32, 32) and loaded.pixel_range == (0.0, 255.0)
    assert loaded.labels.tolist() == [3, 9, 0, 7, 1]
    assert torch.equal(loaded.images, torch.from_numpy(np.concatenate([first, second])).float())  # red plane, then green, blue
    assert images.is_image_source(str(folder / "data_batch_1.bin"))
    assert images.load(str(folder / "data_batch_2.bin")).labels.tolist() == [7, 1]
    (tmp_path / "short.bin").write_bytes((folder / "data_batch_2.bin").read_bytes()[:-5])
    with pytest.raises(ConfigError, match=r"short.bin: 6,141 bytes is not a whole number of CIFAR-10 records \(3,073 bytes"):
        images.load(str(tmp_path / "short.bin"))
    (tmp_path / "empty" / images.CIFAR_FOLDER).mkdir(parents=True)  # the folder, without its batches
    with pytest.raises(ConfigError, match="no data_batch_.*bin files in this folder; it should be CIFAR-10's"):
        images.load(str(tmp_path / "empty" / images.CIFAR_FOLDER))
    _cifar_file(tmp_path / "hundred.bin", [42], seed=4)
    with pytest.raises(ConfigError, match="label bytes up to 42; CIFAR-10's are 0-9"):
        images.load(str(tmp_path / "hundred.bin"))


def test_the_bundled_cifar10_run_starts_on_a_small_file_in_that_format(tmp_path, monkeypatch):
    from ebmcore.config import tomllib  # tomllib, or tomli on Python 3.10

    config = tomllib.loads(train_job.bundled_config_path("cifar10").read_text())  # (load_config checks the device: cuda)
    assert config["data"]["dataset"] == images.CIFAR_FOLDER and config["train"]["device"] == "cuda"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"no such file 'cifar-10-batches-bin'. It is CIFAR-10's binary version: download "
        r"cifar-10-binary.tar.gz",
    ):
        train_job.load_config("cifar10", {"train": {"device": "cpu"}})
    (tmp_path / images.CIFAR_FOLDER).mkdir()
    _cifar_file(tmp_path / images.CIFAR_FOLDER / "data_batch_1.bin", [i % 10 for i in range(40)], seed=5)
    shortened_config(
        "cifar10",
        [
            ("n_train = 49000", "n_train = 30"),
            ("n_test = 1000", "n_test = 10"),
            ("n_steps = 60", "n_steps = 2"),
            ("buffer_size = 10000", "buffer_size = 64"),
            ("widths = [64, 128, 256, 256]", "widths = [4, 8]"),
            ("batch_size = 128", "batch_size = 8"),
            ("image_sample_steps = 200", "image_sample_steps = 2"),
            ("plots = true", "plots = false"),
            ('device = "cuda"', 'device = "cpu"'),
        ],
        tmp_path / "cifar.toml",
    )
    assert main(["train", "cifar.toml", "--out", "run", "--steps", "2", "--quiet"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["image_shape"] == [3, 32, 32] and metrics["pixel_range"] == [0.0, 255.0]
    assert torch.load(tmp_path / "run" / "samples.pt").shape[1:] == (3, 32, 32)


def test_dequantised_digits_fill_17_bins_tiling_minus_one_to_one():
    spec = dict(train_job.load_config("digits")["data"], dequantize=True)
    grid: dict = {}
    train, test, pixel_range = train_job._image_data(spec, grid)
    assert grid == {"levels": 17, "step": 2 / 17} and pixel_range == (-0.5, 16.5)  # plots map back to 0-16
    for x in (train, test):
        assert float(x.min()) >= -1 and float(x.max()) <= 1
        bins = (x + 1) / grid["step"]  # level k fills [k, k + 1)
        offset = bins - bins.floor() - 0.5
        assert float(offset.var()) == pytest.approx(1 / 12, rel=0.05)  # uniform within its bin
    raw, _, _ = train_job._image_data(dict(spec, dequantize=False))
    assert ((train + 1) / grid["step"]).floor().equal((raw * 8 + 8).round())  # each digit kept its levels
    assert train_job._image_data(spec)[0].equal(train)  # seeded: the same draw every time


def test_a_dequantised_digits_run_reports_bits_per_dim_margins_and_both_normalisers(tmp_path, capsys):
    config = _short_digits(tmp_path)
    config.write_text(config.read_text().replace("pixel_range = []", "pixel_range = []\ndequantize = true", 1))
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    deq, base = metrics["dequantised"], metrics["baselines"]
    assert deq["levels"] == 17 and metrics["pixel_range"] == [-0.5, 16.5]
    assert base["uniform"]["bits_per_dim"] == pytest.approx(math.log2(17))
    assert set(deq["margins"]) == {"uniform", "diagonal_gaussian", "gaussian", "gaussian_mixture"}
    assert deq["reliable"] == metrics["ais"]["reliable"] and "importance_sampling" in metrics["ais"]["checks"]
    text = capsys.readouterr().out
    assert "bits/dim" in text and "log Z: AIS" in text and "margins of the model" in text
