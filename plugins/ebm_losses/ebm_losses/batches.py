"""Where the Trainer's batches come from: a tensor or ``Dataset`` in a generator-driven random order (resumable
exactly), or a user ``DataLoader`` restarted when exhausted."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ebmcore.errors import InputError

__all__ = ["Batches", "LoaderBatches"]


class Batches:
    """Batches of a tensor or ``Dataset`` in a generator-driven random order, resumable exactly."""

    def __init__(self, data: Tensor | Dataset, batch_size: int, generator: torch.Generator) -> None:
        self.data, self.batch_size, self.generator = data, batch_size, generator
        self.n = len(data)
        self.batch_size = min(batch_size, self.n)
        self.order: Tensor | None = None
        self.position = 0

    def next(self) -> Tensor:
        if self.order is None or self.position + self.batch_size > self.n:
            self.order = torch.randperm(self.n, generator=self.generator, device=self.generator.device)
            self.position = 0
        idx = self.order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        if isinstance(self.data, Tensor):
            return self.data[idx.to(self.data.device)]
        items = [self.data[int(i)] for i in idx]
        return torch.stack([item[0] if isinstance(item, (tuple, list)) else item for item in items])

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order, self.position = state["order"], state["position"]


class LoaderBatches:
    """Batches of a user ``DataLoader``, restarted when exhausted (resume restarts the epoch)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None

    def next(self) -> Tensor:
        for _ in range(2):
            if self.iterator is None:
                self.iterator = iter(self.loader)
            try:
                item = next(self.iterator)
                return item[0] if isinstance(item, (tuple, list)) else item
            except StopIteration:
                self.iterator = None
        raise InputError("the DataLoader yields no batch.")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iterator = None
