"""The energies the kernels implement, and how each energy's parameters reach them.

The list, with the integer codes of the C API and the names of the energies' ops, is written once,
in the ``EBM_ENERGIES`` X-macro of ``csrc/ebm/energies.h`` (shipped with the package); it is read
here at import into :data:`KINDS`. The kernels take any energy as ``(v0, v1, a, b)`` (``EnergySpec``):
the parameters that the energy's :class:`~ebmcore.energies.AnalyticEnergy` declares (its ``params``
table) fill them in order, a ``(d,)`` vector into ``v0``, a ``(d, d)`` matrix into ``v1`` and floats
into ``a``, then ``b`` (:class:`Layout`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor

from ebmcore.energies import AnalyticEnergy, Param, builtin_analytic_energies
from ebm_cuda.build import CSRC

__all__ = ["HEADER", "KINDS", "LAYOUTS", "Layout", "read_kinds"]

HEADER = CSRC / "ebm" / "energies.h"
"""The header that lists the energies (``EBM_ENERGIES``) and holds their structs."""

_LINE = re.compile(r"^\s*X\(\s*([A-Z][A-Z0-9_]*)\s*,\s*(\d+)\s*,\s*([a-z][a-z0-9_]*)\s*,\s*__VA_ARGS__\s*\)\s*\\?\s*$")


def read_kinds(text: str) -> dict[str, int]:
    """``name -> code`` from the ``#define EBM_ENERGIES(X, ...)`` lines of a header's ``text``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#define EBM_ENERGIES(X, ...)")), None)
    if start is None:
        raise RuntimeError(f"{HEADER.name}: no '#define EBM_ENERGIES(X, ...)' (the list of the kernels' energies)")
    kinds: dict[str, int] = {}
    i = start
    while lines[i].rstrip().endswith("\\"):
        i += 1
        match = _LINE.match(lines[i])
        if match is None:
            raise RuntimeError(
                f"{HEADER.name}:{i + 1}: expected 'X(KIND, code, name, __VA_ARGS__)' in EBM_ENERGIES, got {lines[i].strip()!r}"
            )
        _, code, name = match.groups()
        if name in kinds or int(code) in kinds.values():
            raise RuntimeError(f"{HEADER.name}:{i + 1}: energy {name!r} or code {code} listed twice in EBM_ENERGIES")
        kinds[name] = int(code)
    return kinds


KINDS: dict[str, int] = read_kinds(HEADER.read_text())
"""``name -> code`` of the energies the kernels implement (``EBM_ENERGIES`` in ``csrc/ebm/energies.h``)."""

_SLOTS = {"vector": ("v0",), "matrix": ("v1",), "scalar": ("a", "b")}


@dataclass(frozen=True)
class Layout:
    """Where the kernels take each of an energy's declared parameters: ``slots[i]`` is ``"v0"``,
    ``"v1"``, ``"a"`` or ``"b"`` for ``energy.params[i]``."""

    name: str
    code: int
    energy: type[AnalyticEnergy]
    slots: tuple[str, ...]

    @classmethod
    def of(cls, name: str, code: int, energy: type[AnalyticEnergy]) -> "Layout":
        """The layout of ``energy``'s table; raises ``TypeError`` if it does not fit ``(v0, v1, a, b)``."""
        free = {kind: list(slots) for kind, slots in _SLOTS.items()}
        slots = []
        for p in energy.params:
            if not free.get(p.kind):
                raise TypeError(
                    f"{energy.__qualname__}'s parameters {[q.signature() for q in energy.params]} do not fit the "
                    "kernels' (v0: (d,), v1: (d, d), a: float, b: float): at most one vector, one matrix and "
                    f"two floats; {p.signature()} is one too many. Extend Params in csrc/ebm/energies.h first."
                )
            slots.append(free[p.kind].pop(0))
        return cls(name, code, energy, tuple(slots))

    def tensors(self) -> dict[str, Param]:
        """``slot -> parameter`` for the tensor slots (``v0``, ``v1``) this energy fills."""
        return {s: p for s, p in zip(self.slots, self.energy.params) if s in ("v0", "v1")}

    def unpack(self, *args: Any) -> tuple[Optional[Tensor], Optional[Tensor], float, float]:
        """``kernel_args()`` (in declared order) as the kernels' ``(v0, v1, a, b)``; unused slots None or 0.0."""
        out: dict[str, Any] = {"v0": None, "v1": None, "a": 0.0, "b": 0.0}
        for slot, value in zip(self.slots, args, strict=True):
            out[slot] = float(value) if slot in ("a", "b") else value
        return out["v0"], out["v1"], out["a"], out["b"]


def _layouts() -> dict[str, Layout]:
    energies = builtin_analytic_energies()
    missing = [name for name in KINDS if name not in energies]
    if missing:
        raise RuntimeError(
            f"{HEADER.name} lists {missing} in EBM_ENERGIES, but ebmcore has no analytic energy with that op; "
            f"known ops: {', '.join(energies)}"
        )
    return {name: Layout.of(name, code, energies[name]) for name, code in KINDS.items()}


LAYOUTS: dict[str, Layout] = _layouts()
"""``name -> Layout`` for every energy in :data:`KINDS`."""
