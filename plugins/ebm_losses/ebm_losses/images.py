"""Image data for ``ebm train``: arrays in ``.npz``/``.pt`` files, a folder of PNG files, CIFAR-10's binary batches, or
scikit-learn's digits.

Every loader returns images ``(N, C, H, W)`` as stored (no scaling) and the range their pixels are
on (:class:`ImageSet`): ``0–255`` for 8-bit pixels, ``0–65535`` for 16-bit ones. :func:`to_model_range` maps that range linearly onto ``[−1, 1]``, the range
the models train on; :func:`to_pixel_range` is its inverse, for plots. :func:`split` shuffles with
a seed and holds out a test set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ebmcore import runfiles
from ebmcore.errors import ConfigError, InputError, RunFileError
from ebmcore.validation import all_finite

__all__ = [
    "ImageSet",
    "DIGITS",
    "CIFAR_FOLDER",
    "CIFAR_URL",
    "CIFAR_RECORD_BYTES",
    "load",
    "load_array",
    "load_png_folder",
    "load_cifar_binary",
    "load_digits",
    "is_image_source",
    "to_model_range",
    "to_pixel_range",
    "split",
]

DIGITS = "digits"
"""The name of scikit-learn's handwritten digits (1,797 grey 8×8 images, pixels 0–16; ``pip install ebm-losses[images]``)."""

_ARRAY_KEYS = ("images", "x", "data", "samples")

CIFAR_FOLDER = "cifar-10-batches-bin"
"""The folder CIFAR-10's binary version unpacks to."""
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32
"""One record of CIFAR-10's binary batches (``data_batch_1.bin`` ... ``data_batch_5.bin``, ``test_batch.bin``): a label
byte ``0–9``, then the 1,024 red, 1,024 green and 1,024 blue pixel bytes of a 32×32 image, rows first."""


@dataclass(frozen=True)
class ImageSet:
    """``images: (N, C, H, W)`` float32 as stored, ``pixel_range = (low, high)`` of the stored values, optional
    ``labels: (N,)`` (kept for reports, never used for training)."""

    images: Tensor
    pixel_range: tuple[float, float]
    labels: Tensor | None = None


def is_image_source(name: str) -> bool:
    """Whether a ``[data] dataset`` value names image data rather than a 2-d toy set or a point file."""
    return (
        name == DIGITS
        or Path(name).is_dir()
        or name.endswith(".bin")
        and Path(name).is_file()
        or name.endswith((".npz", ".pt"))
        and _looks_like_images(Path(name))
    )


def _looks_like_images(path: Path) -> bool:
    """Whether ``path`` holds images (an array of 3 dimensions or more); an unreadable ``.npz`` whose arrays are
    named as images (``images``, ``x``, ``data``) counts, so that the image loader says why it cannot be read."""
    try:
        return path.is_file() and _read_array(path).dim() >= 3
    except RunFileError:
        return path.suffix == ".npz" and any(k in _npz_names(path) for k in _ARRAY_KEYS if k != "samples")
    except (ConfigError, OSError, ValueError, RuntimeError):
        return False


def _npz_names(path: Path) -> list[str]:
    """The names of the arrays in an ``.npz``, read from its index alone ([] where it has none)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as arrays:
            return list(arrays.files)
    except Exception:  # noqa: BLE001 - not an .npz at all
        return []


def _as_nchw(values: Tensor, source: str) -> Tensor:
    """``(N, H, W)`` gains a channel; ``(N, H, W, C)`` with ``C`` in 1, 3, 4 and ``C > 4`` pixels wide becomes ``(N, C, H, W)``."""
    if values.dim() == 3:
        return values.unsqueeze(1)
    if values.dim() == 4 and values.shape[1] not in (1, 3, 4) and values.shape[-1] in (1, 3, 4):
        return values.permute(0, 3, 1, 2).contiguous()
    if values.dim() == 4:
        return values
    raise ConfigError(f"{source}: expected images (N, H, W), (N, C, H, W) or (N, H, W, C), got shape {tuple(values.shape)}.")


EIGHT_BIT, SIXTEEN_BIT = (0.0, 255.0), (0.0, 65535.0)


def _default_range(values: Tensor) -> tuple[float, float]:
    """Integer pixels: ``(0, 255)``, or ``(0, 65535)`` for 16-bit ones (``uint16``, as a 16-bit PNG is read, or values
    above 255), so both map onto ``[−1, 1]`` alike; floats: ``(0, 1)`` when within it; otherwise the data's min and max."""
    if values.dtype == torch.uint16:  # torch has no min or max of it
        return SIXTEEN_BIT
    if values.numel() == 0:
        return EIGHT_BIT
    low, high = float(values.min()), float(values.max())
    if not values.is_floating_point() and low >= 0 and high <= SIXTEEN_BIT[1]:
        return EIGHT_BIT if high <= EIGHT_BIT[1] else SIXTEEN_BIT
    return (0.0, 1.0) if values.is_floating_point() and low >= 0.0 and high <= 1.0 else (low, high)


def _real(values: Tensor, where: str) -> Tensor:
    """``values``, or an :class:`InputError` when they are complex: training on their real part alone would be silent."""
    if values.is_complex():
        raise InputError(
            f"{where} is complex ({values.dtype}); images must be real numbers. Save the part you mean to "
            "train on: numpy.abs(a) (the magnitude) or a.real, or the real and imaginary parts as two "
            "channels of (N, 2, H, W) images: numpy.stack([a.real, a.imag], axis=1)."
        )
    return values


def _read_array(path: Path, key: str | None = None) -> Tensor:
    if path.suffix == ".pt":
        obj = runfiles.load_torch(
            path,
            what="a tensor of images",
            fix="save the images alone, as a tensor: torch.save(images, path), images of shape (N, C, H, W)",
        )
        name = ""
        if isinstance(obj, dict):
            found = key or next((k for k in _ARRAY_KEYS if k in obj), None)
            if found is None or found not in obj:
                raise ConfigError(f"{path}: no array under {key or ' / '.join(_ARRAY_KEYS)}; its keys are {sorted(obj)}.")
            obj, name = obj[found], f" {found!r}"
        if not isinstance(obj, Tensor):
            raise ConfigError(f"{path}: expected a tensor, got {type(obj).__name__}.")
        return _real(obj, f"{path}: the tensor{name}")
    arrays = runfiles.load_arrays(
        path, what="an array of images", fix="write numeric images: numpy.savez(path, images=images.astype('float32'))"
    )
    found = key or next((k for k in _ARRAY_KEYS if k in arrays), None) or (next(iter(arrays)) if len(arrays) == 1 else None)
    if found is None or found not in arrays:
        raise ConfigError(f"{path}: no array under {key or ' / '.join(_ARRAY_KEYS)}; it holds {list(arrays)}.")
    try:
        return _real(torch.from_numpy(arrays[found].copy()), f"{path}: the array {found!r}")
    except TypeError as exc:  # strings, or another dtype torch has no tensor for
        raise ConfigError(
            f"{path}: the array {found!r} has dtype {arrays[found].dtype}, not numbers ({exc}); write numeric "
            "images: numpy.savez(path, images=images.astype('float32'))."
        ) from None


def load_array(path: str | Path, key: str | None = None) -> ImageSet:
    """Images from a ``.npz`` (array ``images``, ``x``, ``data`` or ``samples``, or its only array) or a ``.pt`` (a tensor,
    or a dict holding one under those keys); ``key`` picks another array."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no such file {path}.")
    raw = _read_array(path, key)
    values = _as_nchw(raw, str(path))
    if raw.is_floating_point() and not all_finite(raw):
        bad = int((~torch.isfinite(raw)).sum())
        raise InputError(
            f"{path}: the images hold {bad} NaN or infinite value(s) of {raw.numel()}; training on them gives a NaN "
            "loss. Drop those images or fill the values (numpy.nan_to_num(a) or a mask) and save the file again."
        )
    pixel_range = _default_range(raw)
    if not pixel_range[0] < pixel_range[1]:
        raise InputError(
            f"{path}: every value is {pixel_range[0]!r}, so the images have no range to map onto [-1, 1] (their "
            "pixel range is taken from the data outside [0, 1]); check the file, or save images scaled to [0, 1] "
            "or as uint8 pixels."
        )
    return ImageSet(values.float(), pixel_range)


_GREY_16 = ("I;16", "I;16B", "I;16L", "I")  # how Pillow opens a 16-bit grey PNG


def _png_pixels(image: Any, file: Path) -> Any:
    """The pixels of an open PNG as a numpy array: grey ``(H, W)``, ``uint16`` for a 16-bit one (its precision kept),
    or ``(H, W, 3)`` RGB, ``uint8``. A 16-bit colour PNG, which Pillow reads as 8 bits, is an :class:`InputError`."""
    import numpy as np

    if image.mode in _GREY_16:
        return np.asarray(image).astype(np.uint16)
    if any(";16" in str(tile.args) for tile in image.tile):
        raise InputError(
            f"{file} is a 16-bit colour PNG ({image.mode}), which Pillow reads as 8 bits: its precision "
            "would be lost. Save the images as an array instead, numpy.savez(path, images=a) with a uint16 "
            "array a of shape (N, H, W, C), or export them as 8-bit PNGs."
        )
    return np.asarray(image.convert("L") if image.mode in ("L", "P", "1") else image.convert("RGB"))


def load_png_folder(path: str | Path) -> ImageSet:
    """Every ``*.png`` in the folder ``path`` (sorted by name; all of one size, mode and bit depth): 8-bit pixels
    ``0–255``, 16-bit grey ones ``0–65535`` (as read, so both map onto ``[−1, 1]`` alike)."""
    import numpy as np

    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("reading PNG files needs Pillow: pip install 'ebm-losses[images]'.") from None
    path = Path(path)
    files = sorted(path.glob("*.png"))
    if not files:
        raise ConfigError(f"{path}: no .png files in this folder.")
    arrays = []
    for f in files:
        try:
            with Image.open(f) as image:
                arrays.append(_png_pixels(image, f))
        except InputError:
            raise
        except Image.DecompressionBombError as exc:  # not an OSError: it would leave as a traceback
            raise InputError(
                f"{f} is too large to read: {exc} Pillow refuses it (its guard against decompression "
                "bombs). Downscale the image to the size the model trains on (e.g. 32×32 or 64×64), or, "
                "for a file you trust, raise PIL.Image.MAX_IMAGE_PIXELS before loading."
            ) from None
        except (OSError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError; a truncated file too
            raise ConfigError(
                f"{f} cannot be read as a PNG image ({type(exc).__name__}: {exc}); every *.png in {path} "
                "is read: remove it from the folder, or export it again as a PNG."
            ) from None
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ConfigError(f"{path}: the PNG files differ in size or mode ({sorted(shapes)}); resize them to one shape.")
    if len({a.dtype for a in arrays}) > 1:
        raise ConfigError(f"{path}: the PNG files mix 8-bit and 16-bit images; export them at one bit depth.")
    values = _as_nchw(torch.from_numpy(np.stack(arrays)), str(path))
    return ImageSet(values.float(), SIXTEEN_BIT if values.dtype == torch.uint16 else EIGHT_BIT)


def _cifar_batches(path: Path) -> list[Path]:
    """The binary batch files of a CIFAR-10 folder (``data_batch_*.bin``, sorted; the held-out split is drawn from
    them, so ``test_batch.bin`` is not read), or the file ``path`` itself."""
    return sorted(path.glob("data_batch_*.bin")) if path.is_dir() else [path]


def load_cifar_binary(path: str | Path) -> ImageSet:
    """CIFAR-10 from its binary batches (the ``cifar-10-batches-bin`` folder of the "binary version" download, or one
    ``.bin`` file): ``(N, 3, 32, 32)``, pixels ``0–255``, labels ``0–9``. Read as bytes (:data:`CIFAR_RECORD_BYTES` per
    record): nothing is unpickled."""
    import numpy as np

    path = Path(path)
    files = _cifar_batches(path)
    if not files:
        raise ConfigError(
            f"{path}: no data_batch_*.bin files in this folder; it should be CIFAR-10's "
            "cifar-10-batches-bin folder (the binary version, not the Python pickles)."
        )
    images, labels = [], []
    for f in files:
        raw = np.fromfile(f, dtype=np.uint8)
        if raw.size == 0 or raw.size % CIFAR_RECORD_BYTES:
            raise ConfigError(
                f"{f}: {raw.size:,} bytes is not a whole number of CIFAR-10 records ({CIFAR_RECORD_BYTES:,} "
                "bytes each: a label byte, then 3,072 pixel bytes); the file is truncated or not a CIFAR-10 "
                "binary batch (CIFAR-100's records have two label bytes)."
            )
        records = raw.reshape(-1, CIFAR_RECORD_BYTES)
        if int(records[:, 0].max()) > 9:
            raise ConfigError(
                f"{f}: label bytes up to {int(records[:, 0].max())}; CIFAR-10's are 0-9 (is this CIFAR-100, "
                "whose records have two label bytes?)."
            )
        labels.append(torch.from_numpy(records[:, 0].astype(np.int64)))
        images.append(torch.from_numpy(records[:, 1:].copy()).view(-1, 3, 32, 32))
    return ImageSet(torch.cat(images).float(), (0.0, 255.0), torch.cat(labels))


def load_digits() -> ImageSet:
    """scikit-learn's handwritten digits: ``(1797, 1, 8, 8)``, pixels ``0–16``, labels ``0–9`` (no download)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ConfigError("the digits data set needs scikit-learn: pip install 'ebm-losses[images]'.") from None
    bunch = sklearn_digits()
    return ImageSet(torch.from_numpy(bunch.images).float().unsqueeze(1), (0.0, 16.0), torch.from_numpy(bunch.target))


def load(name: str) -> ImageSet:
    """``digits``, CIFAR-10's binary batches (a folder holding ``data_batch_*.bin``, or one ``.bin`` file), a folder
    of PNG files, or a ``.npz``/``.pt`` array file."""
    if name == DIGITS:
        return load_digits()
    path = Path(name)
    if path.suffix == ".bin" or path.is_dir() and (path.name == CIFAR_FOLDER or _cifar_batches(path)):
        return load_cifar_binary(path)  # (a cifar-10-batches-bin folder without its batches: the error says so)
    if path.is_dir():
        return load_png_folder(name)
    return load_array(name)


def to_model_range(images: Tensor, pixel_range: tuple[float, float]) -> Tensor:
    """Map pixels on ``pixel_range = (low, high)`` linearly onto ``[−1, 1]``."""
    low, high = pixel_range
    if not high > low:
        raise InputError(f"pixel_range must have high > low, got {pixel_range}.")
    return (images - low) * (2.0 / (high - low)) - 1.0


def to_pixel_range(images: Tensor, pixel_range: tuple[float, float]) -> Tensor:
    """The inverse of :func:`to_model_range`: ``[−1, 1]`` back onto ``pixel_range`` (values outside are not clipped)."""
    low, high = pixel_range
    return (images + 1.0) * ((high - low) / 2.0) + low


def split(images: Tensor, n_test: int, seed: int) -> tuple[Tensor, Tensor]:
    """Shuffle ``images`` with ``seed`` (a local generator) and hold out ``n_test`` of them: ``(train, test)``."""
    if images.shape[0] < 2:
        raise InputError(
            f"{images.shape[0]} image(s): training needs at least 2, one to train on and one held out for "
            "the test set; add images."
        )
    if not 0 < n_test < images.shape[0]:
        raise InputError(f"n_test must be between 1 and {images.shape[0] - 1} for {images.shape[0]} images, got {n_test}.")
    order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(seed))
    return images[order[n_test:]], images[order[:n_test]]
