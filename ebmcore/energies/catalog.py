"""The builtin analytic energies, found rather than listed: every :class:`AnalyticEnergy` subclass that
declares its own ``op`` in a module of :mod:`ebmcore.energies`.

The builtin plugin registers each under its ``op``, the ``torch`` backend serves its reference
kernels and :mod:`ebmcore.kernels.ops` derives the ops' sample inputs from its parameter table, so
a new builtin analytic energy is one class in one module here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

from ebmcore.energies.analytic import AnalyticEnergy

__all__ = ["builtin_analytic_energies", "declares_op"]


def declares_op(cls: object) -> bool:
    """Whether ``cls`` is an :class:`AnalyticEnergy` subclass that sets ``op`` in its own body."""
    return isinstance(cls, type) and issubclass(cls, AnalyticEnergy) and "op" in vars(cls)


@functools.cache
def builtin_analytic_energies() -> dict[str, type[AnalyticEnergy]]:
    """``op -> class`` for the analytic energies of :mod:`ebmcore.energies`, by module name, then in
    order of definition."""
    found: dict[str, type[AnalyticEnergy]] = {}
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        for obj in vars(module).values():
            if declares_op(obj) and obj.__module__ == module.__name__:
                if obj.op in found:
                    raise RuntimeError(f"{obj.__qualname__} and {found[obj.op].__qualname__} both declare op {obj.op!r}")
                found[obj.op] = obj
    return found
