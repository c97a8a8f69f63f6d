"""Looking components up by name: energies, samplers, integrators, losses, kernel backends.

Public API::

    ebmcore.registry.names("sampler")           # -> the names the installed plugins registered, sorted
    entry = ebmcore.registry.get("energy", "gaussian")
    entry.distribution, entry.version            # who provided it
    energy = entry(dim=2)                         # an Entry calls its component

The first lookup loads the plugins (:mod:`ebmcore.plugins`). Plugins never touch the tables
directly: their ``ebm_register_*`` hooks get a :class:`Registrar` bound to them, which stamps every
entry with the plugin, distribution and version (:mod:`ebmcore.components`).
"""

from __future__ import annotations

from ebmcore import plugins
from ebmcore.components import KINDS, ComponentTable, Entry, Kind, Provider, Registrar

__all__ = ["Kind", "KINDS", "Entry", "Provider", "Registrar", "ComponentTable", "names", "get", "entries"]


def names(kind: str) -> list[str]:
    """Sorted names registered for ``kind`` (one of ``energy``, ``sampler``, ``integrator``, ``loss``, ``kernel``)."""
    return plugins.session().table.names(kind)


def entries(kind: str) -> list[Entry]:
    """Every unambiguous :class:`Entry` of ``kind``, sorted by name."""
    return plugins.session().table.entries(kind)


def get(kind: str, name: str) -> Entry:
    """The :class:`Entry` registered as ``name`` for ``kind``.

    Raises :class:`UnknownComponentError` listing the available names, the
    install command where a first-party plugin provides ``name``, and any
    plugin failures; :class:`DuplicateComponentError` if two plugins claim it.
    """
    s = plugins.session()
    return s.table.get(kind, name, failures=s.failure_summary())
