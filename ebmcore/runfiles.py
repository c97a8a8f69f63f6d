"""Files a run writes besides its plots: metrics and configurations as JSON, samples as ``.pt`` and ``.npz``.

Every file is written under a temporary name and renamed into place, so an interrupted run never
leaves a half-written file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["write_json", "save_samples", "as_numpy"]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically as indented JSON (tensors become lists)."""
    def default(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value.tolist()
        if isinstance(value, (np.ndarray, np.generic)):
            return value.tolist()
        return str(value)

    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=default, allow_nan=True))
    os.replace(tmp, path)


def as_numpy(value: Tensor) -> np.ndarray:
    """``value`` on the CPU as a numpy array (half precision as float32, which numpy and other tools read)."""
    cpu = value.detach().cpu()
    return (cpu.float() if cpu.dtype in (torch.bfloat16, torch.float16) else cpu).numpy()


def save_samples(directory: Path, name: str, samples: Tensor) -> None:
    """``name.pt`` (torch) and ``name.npz`` (numpy, key ``samples``), each written atomically."""
    cpu = samples.detach().cpu()
    tmp = directory / f"{name}.pt.tmp"
    torch.save(cpu, tmp)
    os.replace(tmp, directory / f"{name}.pt")
    tmp_npz = directory / f"{name}.tmp.npz"
    np.savez(tmp_npz, samples=as_numpy(cpu))
    os.replace(tmp_npz, directory / f"{name}.npz")
