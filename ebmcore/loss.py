"""The loss base class: a training objective for an energy model on a batch of data."""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from ebmcore.energies.base import EnergyModel
from ebmcore.errors import InputError
from ebmcore.validation import all_finite, check_finite, check_finite_parameters, check_generator

__all__ = ["Loss"]


_FINITE_PARAMETERS: "weakref.WeakKeyDictionary[EnergyModel, list[tuple[Tensor, int]]]" = weakref.WeakKeyDictionary()
"""Per energy, its floating parameters and their version counters when :meth:`Loss.check_data` last found them
finite: a training step changes them (an optimizer's in-place update bumps the counters) and they are summed again;
a loss called again on unchanged weights (evaluation, a benchmark) skips that sum."""


def _unverified_parameters(energy: EnergyModel) -> list[Tensor]:
    """``energy``'s floating parameters, or none where they are the same tensors, unchanged, as when last found finite.
    (A write through ``p.data`` bumps no counter and is seen at the next in-place update.)"""
    params = [p for p in energy.parameters() if p.is_floating_point()]
    seen = _FINITE_PARAMETERS.get(energy)
    if seen is not None and len(seen) == len(params) and all(q is p and v == p._version for (q, v), p in zip(seen, params)):
        return []
    return params


class Loss(ABC):
    """``loss(energy, data) -> scalar`` to minimise; gradients flow to ``energy``'s parameters.

    A loss uses the energy but does not own it (not an ``nn.Module``
    container of the model). State a loss keeps between steps (a replay
    buffer, a learnable normaliser) goes in :meth:`state_dict`; learnable
    parameters of its own are returned by :meth:`parameters`.
    """

    @abstractmethod
    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """The scalar loss on ``data: (batch, *event_shape)``."""

    def check_data(self, energy: EnergyModel, data: Tensor, min_rows: int = 1, *, generator: Any = None) -> Tensor:
        """``energy`` an :class:`EnergyModel`, ``generator`` None or a ``torch.Generator`` on ``data``'s device, and
        ``data`` checked against ``energy`` (shape, dtype, device), holding at least ``min_rows`` rows and finite
        (one host sync, which covers the energy's parameters too): an empty or NaN batch, or a NaN parameter, would
        give a NaN loss, not an error naming it."""
        if not isinstance(energy, EnergyModel):
            raise InputError(
                f"{type(self).__name__} needs an ebmcore.EnergyModel as its first argument, got "
                f"{type(energy).__name__}; subclass EnergyModel and implement compute_energy(x) "
                "(a plain function or nn.Module is not one)."
            )
        energy.validate(data, name="data")
        check_generator(generator, data, name="data")
        if data.shape[0] < min_rows:
            raise InputError(
                f"{type(self).__name__} needs a batch of at least {min_rows} row(s), got data of shape "
                f"{tuple(data.shape)}; check the data loader (an empty last batch: drop_last=True)."
            )
        params = _unverified_parameters(energy)
        if all_finite(data, *params):
            if params:
                _FINITE_PARAMETERS[energy] = [(p, p._version) for p in params]
            return data
        check_finite(data, what="data", fix="Drop or impute those rows before training.")
        check_finite_parameters(energy, owner=type(energy).__name__)
        return data

    def parameters(self) -> list[torch.nn.Parameter]:
        """Learnable parameters the loss owns itself (e.g. a learnable log-normaliser); train them with the model's."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """State kept between steps, for checkpoints; empty by default (override in losses that keep state)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; by default accepts only an empty dict and raises ``InputError`` otherwise."""
        if state:
            raise InputError(
                f"{type(self).__name__} keeps no state, got keys {sorted(state)}; is this checkpoint from another loss?"
            )
