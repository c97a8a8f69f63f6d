"""Scores of several batches at once, each on its own CUDA stream.

Small batches leave most of a GPU idle; launching each batch's kernels on a separate stream lets
them run concurrently. On the CPU the batches run one after another.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ebmcore import EnergyModel

__all__ = ["gradients_on_streams", "scores_on_streams"]


def gradients_on_streams(energy: EnergyModel, batches: Sequence[Tensor]) -> list[Tensor]:
    """``∇ₓE`` of each batch ``(n_i, *event_shape)``, computed on one CUDA stream per batch.

    The returned tensors are ready on the current stream (it waits for every side stream), and
    the caching allocator is told which streams use which memory, so nothing is freed early.
    """
    if not batches:
        return []
    device = batches[0].device
    if device.type != "cuda":
        return [energy.gradient(b) for b in batches]
    main = torch.cuda.current_stream(device)
    out = []
    for batch in batches:
        side = torch.cuda.Stream(device)
        side.wait_stream(main)  # the batch is ready
        with torch.cuda.stream(side):
            batch.record_stream(side)
            out.append(energy.bind(batch).gradient(batch))
        main.wait_stream(side)
        out[-1].record_stream(main)
    return out


def scores_on_streams(energy: EnergyModel, batches: Sequence[Tensor]) -> list[Tensor]:
    """The score ``−∇ₓE`` of each batch, one CUDA stream per batch (see :func:`gradients_on_streams`)."""
    return [g.neg_() for g in gradients_on_streams(energy, batches)]
