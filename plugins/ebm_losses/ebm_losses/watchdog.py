"""The training watchdog: detect a diverging run and roll it back to its last good state with a lower learning rate.

Every ``check_every`` steps (and before every checkpoint) the :class:`~ebm_losses.Trainer` measures, in one host
sync, the energies of the step's batch and of the loss's negatives (``loss.last_negatives``, where the loss keeps
them), the global gradient norm (of the check's step; with ``clip_grad_norm``, the largest since the last check), and
the spread of the negatives against the batch's. A non-finite loss is seen at every step, from the value the loop
syncs anyway. A check that passes makes the current state the *last good state* (an in-memory copy); a failure restores it, lowers
the learning rate, and training continues, at most ``max_rollbacks`` times. Only a state that passed the checks is
a rollback target: the state a run starts from is checked on its first batch (finite energies), and its energy
spread is the first reference, so the first check after steps is judged too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ebmcore.errors import InputError

__all__ = ["Watchdog"]


@dataclass(frozen=True)
class Watchdog:
    """What the watchdog checks and how it recovers (``Trainer(watchdog=Watchdog(...))``; ``watchdog=False`` turns it off).

    - ``check_every``: steps between checks (also run before every checkpoint); a non-finite loss is caught at
      every step.
    - ``max_rollbacks``: rollbacks allowed in the whole run; one more divergence is a ``DivergenceError``.
    - ``lr_factor``: each rollback multiplies every parameter group's learning rate by it (for the rest of the run).
    - ``energy_factor``, ``energy_floor``: the energies blew up when their spread (the standard deviation of the
      energies of the batch and the negatives together, in nats) exceeds ``energy_factor × max(reference,
      energy_floor)``.
    - The gradient norm is that of the check's step; with ``clip_grad_norm`` (which computes the norm at every step
      anyway) it is the largest since the last check, before clipping.
    - ``grad_factor``, ``grad_floor``: the gradient blew up when its global 2-norm exceeds ``grad_factor × max(reference, grad_floor)``.
    - ``reference_decay``: the references are running geometric means of the values at passing checks:
      ``log ref ← decay·log ref + (1 − decay)·log value``; the first check sets them.
    - ``collapse_fraction``: the negatives collapsed when their spread (RMS over dimensions of the per-dimension
      standard deviation) is under this fraction of the batch's; ``0`` turns the test off.
    """

    check_every: int = 50
    max_rollbacks: int = 3
    lr_factor: float = 0.5
    energy_factor: float = 50.0
    energy_floor: float = 1.0
    grad_factor: float = 100.0
    grad_floor: float = 1.0
    reference_decay: float = 0.9
    collapse_fraction: float = 0.05

    def __post_init__(self) -> None:
        for name in ("check_every", "max_rollbacks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "check_every" else 0):
                raise InputError(f"Watchdog {name} must be an integer >= {1 if name == 'check_every' else 0}, got {value!r}.")
        for name, low, high in (("lr_factor", 0.0, 1.0), ("reference_decay", 0.0, 1.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and low < value < high):
                raise InputError(f"Watchdog {name} must be in ({low:g}, {high:g}), got {value!r}.")
        for name in ("energy_factor", "grad_factor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 1):
                raise InputError(f"Watchdog {name} must be a finite number > 1, got {value!r}.")
        for name in ("energy_floor", "grad_floor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InputError(f"Watchdog {name} must be a finite number > 0, got {value!r}.")
        if not (isinstance(self.collapse_fraction, (int, float)) and 0 <= self.collapse_fraction < 1):
            raise InputError(f"Watchdog collapse_fraction must be in [0, 1), got {self.collapse_fraction!r}.")

    @classmethod
    def from_config(cls, value: bool | dict[str, Any]) -> Watchdog | None:
        """``[train] watchdog``: ``true`` (the defaults), ``false`` (None: off) or a table of these settings."""
        if isinstance(value, bool):
            return cls() if value else None
        try:
            return cls(**value)
        except TypeError:
            known = ", ".join(cls.__dataclass_fields__)
            unknown = ", ".join(sorted(set(value) - set(cls.__dataclass_fields__)))
            raise InputError(f"unknown watchdog setting(s) {unknown}; the settings are {known}.") from None

    def settings(self) -> dict[str, Any]:
        """The settings, for ``metrics.json``."""
        return asdict(self)

    def verdict(self, stats: dict[str, float], references: dict[str, float | None]) -> str | None:
        """What diverged at a check, or None. ``stats``: ``nonfinite_energies`` (count), ``energy_spread``,
        ``nonfinite_grad`` (0 or 1), ``grad_max``, ``negatives_spread`` and ``data_spread`` (NaN when not
        measured); ``references``: the running
        ``energy`` and ``grad`` references (None before the first passing check)."""
        if stats["nonfinite_energies"] > 0:
            return f"{int(stats['nonfinite_energies'])} non-finite energies of the batch and the negatives"
        if stats["nonfinite_grad"] > 0:
            return "a non-finite gradient (NaN or inf in the global gradient norm)"
        grad = stats["grad_max"]
        ref = references.get("energy")
        spread = stats["energy_spread"]
        if ref is not None and spread > self.energy_factor * max(ref, self.energy_floor):
            return (
                f"the energy scale blew up: spread {spread:.4g} nats, over {self.energy_factor:g}× the reference "
                f"{max(ref, self.energy_floor):.4g}"
            )
        ref = references.get("grad")
        if ref is not None and grad > self.grad_factor * max(ref, self.grad_floor):
            return (
                f"the gradient norm blew up: {grad:.4g}, over {self.grad_factor:g}× the reference {max(ref, self.grad_floor):.4g}"
            )
        neg, data = stats["negatives_spread"], stats["data_spread"]
        if self.collapse_fraction and data > 0 and neg < self.collapse_fraction * data:
            return f"the negatives collapsed: their spread {neg:.4g} is under {self.collapse_fraction:g}× the data's {data:.4g}"
        return None

    def updated(self, references: dict[str, float | None], stats: dict[str, float]) -> dict[str, float | None]:
        """The references after a passing check (geometric running means of ``energy_spread`` and ``grad_max``)."""
        out = dict(references)
        for key, stat in (("energy", "energy_spread"), ("grad", "grad_max")):
            value = stats[stat]
            if math.isnan(value):
                continue
            value = max(value, 1e-30)
            old = out.get(key)
            out[key] = (
                value
                if old is None
                else math.exp(self.reference_decay * math.log(old) + (1 - self.reference_decay) * math.log(value))
            )
        return out
