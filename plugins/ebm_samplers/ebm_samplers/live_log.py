"""A live view of a long run: ``log.csv``, one row per logging interval, flushed as written (``tail -f``), and with the
``tensorboard`` package TensorBoard event files of the same scalars, text events and image grids.

:class:`LiveLog` is the writer both the training loop (:class:`ebm_losses.Trainer`) and ``ebm sample``'s streamed and
checkpointed runs use. A row is keyed by its first column (a step, a chunk); :meth:`LiveLog.open` with ``after``
continues a file (a resumed run: the rows past ``after`` are dropped, so none is written twice) and :meth:`LiveLog.rewind`
drops rows past a step during a run (a rollback). Rows hold plain numbers, so each line of the file is one row.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from ebmcore.errors import InputError, MissingDependencyError
from ebmcore.runfiles import make_dir

__all__ = ["LiveLog", "CSV_NAME", "unavailable"]

CSV_NAME = "log.csv"
"""The CSV file a :class:`LiveLog` writes in its directory."""

_DISTRIBUTIONS = {"train": "ebm-losses", "sample": "ebm-samplers"}  # whose extra a log of this prefix names


def unavailable(prefix: str = "train") -> str | None:
    """Why TensorBoard event files cannot be written here, or None; the fix names the extra of the job of ``prefix``."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (imports the tensorboard package)
    except ImportError as exc:
        extra = f"{_DISTRIBUTIONS.get(prefix, 'ebm-samplers')}[tensorboard]"
        return f"TensorBoard logging needs the tensorboard package ({exc}): pip install '{extra}'"
    return None


def _cell(value: Any) -> str:
    """A CSV cell: empty for None, the shortest exact text of a float (``repr``), else ``str``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class LiveLog:
    """Write a run's scalars as it goes: ``directory/log.csv`` and, with ``tensorboard=True``, TensorBoard event files
    in ``directory`` (``tensorboard --logdir`` on it, or on its parent for several runs).

    ``every``: the interval the caller logs at (:meth:`due`); ``images_every``: the interval of image grids
    (:meth:`images_due`; 0 for none; they go to TensorBoard only); ``image_range``: the values shown black and white;
    ``prefix``: the TensorBoard tags' group (``train/loss``). A missing ``tensorboard`` package is a
    :class:`~ebmcore.errors.MissingDependencyError` naming the extra to install.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every: int = 1,
        tensorboard: bool = False,
        images_every: int = 0,
        image_range: tuple[float, float] = (-1.0, 1.0),
        max_images: int = 64,
        prefix: str = "train",
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise InputError(f"directory must be a path (a str or pathlib.Path), got {type(directory).__name__} {directory!r}.")
        for name, value, low in (("every", every, 1), ("images_every", images_every, 0), ("max_images", max_images, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}.")
        if not isinstance(tensorboard, bool):
            raise InputError(f"tensorboard must be True or False, got {tensorboard!r}.")
        if images_every and not tensorboard:
            raise InputError(f"images_every={images_every}: image grids go to TensorBoard only; pass tensorboard=True too.")
        if not (len(image_range) == 2 and image_range[1] > image_range[0]):
            raise InputError(f"image_range must be (low, high) with high > low, got {image_range!r}.")
        if tensorboard and (why := unavailable(prefix)) is not None:
            raise MissingDependencyError(f"{why}; or log to {CSV_NAME} alone with tensorboard=False.")
        self.directory, self.every, self.tensorboard = Path(directory), every, tensorboard
        self.images_every, self.image_range, self.max_images, self.prefix = images_every, image_range, max_images, prefix
        self.columns: tuple[str, ...] = ()
        self._file: Any = None
        self._writer: Any = None
        self._rows: list[tuple[float, int]] = []  # (key, byte offset where its line starts), in file order

    @staticmethod
    def config_problem(
        value: Any, keys: Sequence[str] = ("every", "tensorboard", "images_every"), prefix: str = "train"
    ) -> str | None:
        """What is wrong with a job's ``live_log`` setting (a SCHEMA rule), or None: ``false`` (off), ``true`` (a CSV
        row every 50 steps) or a table of ``keys``: ``every`` (an integer >= 1), ``tensorboard`` (a bool; the package
        must be installed) and ``images_every`` (an integer >= 0; needs ``tensorboard = true``)."""
        if isinstance(value, bool):
            return None
        unknown = sorted(set(value) - set(keys))
        if unknown:
            return f"has unknown key(s) {', '.join(unknown)} (the keys are {', '.join(keys)})"
        for name, low in (("every", 1), ("images_every", 0)):
            number = value.get(name, low)
            if not isinstance(number, int) or isinstance(number, bool) or number < low:
                return f"must have {name} = an integer >= {low}"
        tensorboard = value.get("tensorboard", False)
        if not isinstance(tensorboard, bool):
            return "must have tensorboard = true or false"
        if value.get("images_every") and not tensorboard:
            return "sets images_every, whose image grids go to TensorBoard only: add tensorboard = true"
        if tensorboard and (why_not := unavailable(prefix)) is not None:
            return f"sets tensorboard = true: {why_not}; or log to {CSV_NAME} alone (tensorboard = false)"
        return None

    @classmethod
    def from_config(cls, value: bool | dict[str, Any], directory: str | os.PathLike, *, prefix: str = "train") -> LiveLog | None:
        """The log of a checked ``live_log`` setting (:meth:`config_problem`) writing in ``directory``; None for ``false``."""
        if value is False:
            return None
        table = {} if value is True else dict(value)
        return cls(
            directory,
            every=table.get("every", 50),
            tensorboard=table.get("tensorboard", False),
            images_every=table.get("images_every", 0),
            prefix=prefix,
        )

    @property
    def path(self) -> Path:
        """The CSV file."""
        return self.directory / CSV_NAME

    def due(self, key: int) -> bool:
        """Whether a row is due at ``key`` (a multiple of ``every``)."""
        return key % self.every == 0

    def images_due(self, key: int) -> bool:
        """Whether an image grid is due at ``key``."""
        return bool(self.images_every) and key % self.images_every == 0

    # -- opening, rows, rewinding ---------------------------------------------------------------------

    def open(self, columns: Sequence[str], *, after: int | None = None) -> LiveLog:
        """Start writing rows of ``columns`` (the first is the key). ``after=None``: a fresh run (the CSV starts over,
        earlier event files in the directory are removed); an int: continue the run (the rows with a key past ``after``
        are dropped, a file of other columns is rewritten with these, and TensorBoard hides its events past it).
        Returns the log, which :meth:`close` closes (also as a context manager)."""
        self.close()
        self.columns = tuple(columns)
        make_dir(self.directory)
        header = (",".join(self.columns) + "\n").encode()
        kept: list[bytes] = []
        if after is not None and self.path.is_file():
            lines = self.path.read_bytes().split(b"\n")
            old = lines[0].decode(errors="replace").split(",")
            for line in lines[1:]:
                cells = line.decode(errors="replace").split(",")
                if len(cells) != len(old) or not self._is_key(cells[0]) or float(cells[0]) > after:
                    break  # the first row past `after`, or a line cut short by an interruption: drop from here
                kept.append(line if old == list(self.columns) else self._reorder(dict(zip(old, cells))))
        else:
            self._clear_events()
        self._rows, offset = [], len(header)
        for line in kept:
            self._rows.append((float(line.split(b",", 1)[0]), offset))
            offset += len(line) + 1
        with open(self.path, "wb") as file:
            file.write(header + b"".join(line + b"\n" for line in kept))
        self._file = open(self.path, "ab")
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if after is None else max(int(after) + 1, 0)
            self._writer = SummaryWriter(log_dir=str(self.directory), purge_step=purge, flush_secs=10)
        return self

    @staticmethod
    def _is_key(cell: str) -> bool:
        try:
            return math.isfinite(float(cell))
        except ValueError:
            return False

    def _reorder(self, row: dict[str, str]) -> bytes:
        return ",".join(row.get(c, "") for c in self.columns).encode()

    def _clear_events(self) -> None:
        for path in self.directory.glob("events.out.tfevents.*"):
            path.unlink(missing_ok=True)

    def row(self, key: int, values: dict[str, Any]) -> None:
        """Write a row: ``values`` by column (a missing one or None: an empty cell; an unknown one is an error), the
        CSV line flushed, and each number as the TensorBoard scalar ``<prefix>/<column>`` at step ``key``."""
        self._check_open()
        unknown = set(values) - set(self.columns)
        if unknown:
            raise InputError(f"unknown column(s) {', '.join(sorted(unknown))}; the log's columns are {', '.join(self.columns)}.")
        values = {self.columns[0]: key, **values}
        line = ",".join(_cell(values.get(c)) for c in self.columns).encode() + b"\n"
        self._rows.append((float(key), self._file.tell()))
        self._file.write(line)
        self._file.flush()
        if self._writer is not None:
            for name in self.columns[1:]:
                value = values.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "wall_time":
                    self._writer.add_scalar(f"{self.prefix}/{name}", value, key, walltime=values.get("wall_time"))
            self._writer.flush()

    def rewind(self, after: int) -> None:
        """Drop the rows whose key is past ``after`` (the CSV is truncated in place, which ``tail -f`` follows;
        TensorBoard drops the scalars it sees again at earlier steps)."""
        self._check_open()
        cut = next((i for i, (key, _) in enumerate(self._rows) if key > after), None)
        if cut is not None:
            self._file.flush()
            self._file.truncate(self._rows[cut][1])
            self._file.seek(self._rows[cut][1])  # truncate leaves the position where it was
            del self._rows[cut:]

    def event(self, key: int, text: str) -> None:
        """A text event at ``key`` (a watchdog rollback, a divergence): TensorBoard's text tab, tag ``<prefix>/events``."""
        self._check_open()
        if self._writer is not None:
            self._writer.add_text(f"{self.prefix}/events", text, key, walltime=time.time())
            self._writer.flush()

    def images(self, key: int, images: Tensor, tag: str = "negatives") -> None:
        """An image grid at ``key``: the first ``max_images`` of ``images`` ``(n, C, H, W)``, ``C`` 1 or 3, with
        ``image_range`` mapped onto black to white (TensorBoard only)."""
        self._check_open()
        if not (isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] in (1, 3)):
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise InputError(f"images must be a tensor (n, C, H, W) with C = 1 or 3, got {shape}.")
        if self._writer is None:
            return
        low, high = self.image_range
        grid = ((images[: self.max_images].detach().float().cpu() - low) / (high - low)).clamp(0, 1)
        self._writer.add_images(f"{self.prefix}/{tag}", torch.nan_to_num(grid), key, dataformats="NCHW")
        self._writer.flush()

    def _check_open(self) -> None:
        if self._file is None:
            raise InputError("the log is not open: call open(columns) first (the Trainer and ebm sample do).")

    def close(self) -> None:
        """Flush and close the files (the log can be opened again, with ``after``, to continue)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> LiveLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
