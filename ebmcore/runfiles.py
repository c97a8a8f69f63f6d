"""Files a run writes and reads back: metrics and configurations as JSON, samples as ``.pt`` and ``.npz``,
checkpoints, models and plots; and what a run directory already holds.

Every file is written under a temporary name (``name.tmp.suffix``), flushed to the disk (fsync), and
renamed into place, so an interrupted run never leaves a half-written file behind. A write that fails
(read-only directory, full disk) removes its temporary file and raises :class:`RunFileError` naming the
path; the files written before it are untouched. Files are read back with :func:`load_torch` and
:func:`load_arrays` (``.npz``), which name a missing, truncated or foreign file and the fix.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ebmcore.errors import ConfigError, RunFileError

log = logging.getLogger(__name__)

__all__ = [
    "write_bytes",
    "write_json",
    "save_torch",
    "save_samples",
    "as_numpy",
    "load_torch",
    "load_arrays",
    "check_run_dir",
    "make_dir",
    "start_run",
    "finished_run",
    "clear_run",
]


def _write(tmp: Path, data: bytes | memoryview) -> None:
    """The one place where a run file's bytes reach the disk: create ``tmp``, write, fsync."""
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: some file systems refuse to fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cannot(action: str, path: Path, exc: OSError) -> RunFileError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space on that disk, or choose another run directory (--out)"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {path.parent} writable, or choose another run directory (--out)"
    else:
        fix = "check the path, or choose another run directory (--out)"
    return RunFileError(f"cannot {action} {path}: {reason} (errno {exc.errno}); {fix}. Files written before it are intact.")


def write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file, fsync, rename; :class:`RunFileError` if it fails."""
    path = Path(path)
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    try:
        _write(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        raise _cannot("write", path, exc) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    _sync_dir(path.parent)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically as indented JSON (tensors become lists)."""
    write_bytes(path, json.dumps(data, indent=2, default=_plain, allow_nan=True).encode())


def _plain(value: Any) -> Any:
    if isinstance(value, (Tensor, np.ndarray, np.generic)):
        return value.tolist()
    return str(value)


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically (checkpoints, segments, models)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes(path, buffer.getbuffer())


def as_numpy(value: Tensor) -> np.ndarray:
    """``value`` on the CPU as a numpy array (half precision as float32, which numpy and other tools read)."""
    cpu = value.detach().cpu()
    return (cpu.float() if cpu.dtype in (torch.bfloat16, torch.float16) else cpu).numpy()


def save_samples(directory: Path, name: str, samples: Tensor, *, torch_copy: bool = True) -> None:
    """``name.pt`` (torch; not with ``torch_copy=False``) and ``name.npz`` (numpy, key ``samples``), each atomically."""
    cpu = samples.detach().cpu()
    if torch_copy:
        save_torch(cpu, directory / f"{name}.pt")
    buffer = io.BytesIO()
    np.savez(buffer, samples=as_numpy(cpu))
    write_bytes(directory / f"{name}.npz", buffer.getbuffer())


def load_torch(path: Path, *, map_location: Any = None, what: str, fix: str) -> Any:
    """``torch.load(path, weights_only=True)``; a missing, truncated or foreign file is a :class:`RunFileError`
    naming ``what`` it should hold and the ``fix``."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file (expected {what}); {fix}.") from None
    except Exception as exc:  # noqa: BLE001 - torch reports a bad file with RuntimeError, EOFError, UnpicklingError, ...
        if "Weights only load failed" in str(exc):  # a pickle of Python objects: refused, never run
            raise RunFileError(
                f"{path} holds pickled Python objects, which ebm never loads (it expected {what}); {fix}."
            ) from None
        reason = str(exc).strip().splitlines()[0].split(". ")[0] if str(exc).strip() else type(exc).__name__
        raise RunFileError(
            f"{path} cannot be read as {what} ({type(exc).__name__}: {reason}): it is truncated or was not written by ebm; {fix}."
        ) from None


def load_arrays(path: Path, *, what: str, fix: str, keys: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, read without pickle (``allow_pickle=False``), holding at least
    ``keys``; a missing, truncated or foreign file, an object (pickled) array or a missing key is a
    :class:`RunFileError` naming ``what`` the file should hold and the ``fix``."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file (expected {what}); {fix}.") from None
    except ValueError as exc:  # numpy's words for an object array, or a pickle, with allow_pickle=False
        if "Object arrays" in str(exc):
            raise RunFileError(
                f"{path} holds object (pickled) arrays, which ebm never loads (it expected {what}); {fix}."
            ) from None
        if "pickle" in str(exc):
            raise RunFileError(
                f"{path} cannot be read as {what}: it is not an .npz (numpy would read it as a pickle, "
                f"which ebm never loads); {fix}."
            ) from None
        raise RunFileError(f"{path} cannot be read as {what} (ValueError: {exc}); {fix}.") from None
    except Exception as exc:  # noqa: BLE001 - a bad file: BadZipFile, EOFError, OSError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunFileError(
            f"{path} cannot be read as {what} ({type(exc).__name__}: {reason}): it is truncated or not an .npz; {fix}."
        ) from None
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise RunFileError(
            f"{path} has no array {', '.join(map(repr, missing))} (it holds {', '.join(arrays) or 'none'}; "
            f"expected {what}); {fix}."
        )
    return arrays


def check_run_dir(out: Path) -> None:
    """Refuse a run directory that is an existing file (checked before any work)."""
    if out.exists() and not out.is_dir():
        raise RunFileError(
            f"the run directory {out} is an existing file; choose a directory (--out), which is created if missing."
        )


def make_dir(path: Path) -> None:
    """``mkdir -p path``, or a :class:`RunFileError` naming it."""
    check_run_dir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot("create the directory", path, exc) from None


def start_run(out: Path, config: dict[str, Any]) -> None:
    """Begin a run in ``out``: the previous run's ``metrics.json`` goes (so that only a finished run has one, see
    :func:`finished_run`), and ``config.json`` records this one."""
    try:
        (out / "metrics.json").unlink(missing_ok=True)
    except OSError as exc:
        raise _cannot("remove", out / "metrics.json", exc) from None
    write_json(out / "config.json", config)


def finished_run(
    out: Path, config: dict[str, Any], expected: Callable[[dict[str, Any]], list[str]] = lambda m: []
) -> dict[str, Any] | None:
    """The metrics of the run in ``out`` if it finished with this same ``config`` (its ``config.json`` equal, its
    ``metrics.json`` written, and the files ``expected(metrics)`` names, relative to ``out``, all there), else None."""
    try:
        saved = json.loads((out / "config.json").read_text())
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    if saved != json.loads(json.dumps(config, default=_plain)):
        return None
    return metrics if all((out / name).is_file() for name in expected(metrics)) else None


def reuse_or_clear(
    out: Path,
    config: dict[str, Any],
    expected: Callable[[dict[str, Any]], list[str]],
    *,
    resume: bool,
    overwrite: bool,
    what: str,
    again: str,
) -> dict[str, Any] | None:
    """The start every job shares: refuse ``--resume`` with ``--overwrite`` and a run directory that is a file;
    then the metrics of a finished ``what`` ("run", "training") of this ``config`` in ``out`` (:func:`finished_run`,
    logged as nothing to do: ``again`` says how to redo it), or None after clearing ``out`` under ``overwrite``."""
    if resume and overwrite:
        raise ConfigError(f"--resume continues the {what} in the directory and --overwrite starts it afresh: give one.")
    check_run_dir(out)
    finished = None if overwrite else finished_run(out, config, expected)
    if finished is not None:
        log.info(
            "%s holds a finished %s of this configuration, summarised below: nothing to do (pass --overwrite to %s, "
            "or choose another --out).",
            out,
            what,
            again,
        )
        return finished
    if overwrite:
        clear_run(out)
    return None


_RESUMABLE = ("metrics.json", "checkpoint.pt", "segments/segment-*.pt", "chunks/chunk-*.npz")


def clear_run(out: Path) -> None:
    """Remove what a later run would take for its own (``--overwrite``): the metrics, the checkpoint, the
    checkpointed segments and the streamed chunks. The other files are replaced as the new run writes them."""
    for pattern in _RESUMABLE:
        for path in out.glob(pattern):
            try:
                path.unlink()
            except OSError as exc:
                raise _cannot("remove", path, exc) from None
