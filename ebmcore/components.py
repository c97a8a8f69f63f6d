"""Registered components and who provided them: the data the plugin session keeps.

An :class:`Entry` is one named component (energy, sampler, integrator, loss, kernel backend) stamped
with the plugin, distribution and version that registered it. Plugins never build entries
themselves: their ``ebm_register_*`` hooks get a :class:`Registrar` bound to them. A
:class:`ComponentTable` holds one loading session's entries and settles name clashes. The lookup
functions users call (``ebmcore.registry.get`` ...) are in :mod:`ebmcore.registry`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from ebmcore.errors import DuplicateComponentError, InputError, PluginError, UnknownComponentError

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

__all__ = [
    "Kind",
    "KINDS",
    "Entry",
    "Provider",
    "Registrar",
    "ComponentTable",
    "FIRST_PARTY_DISTRIBUTIONS",
    "declared_plugins",
    "HOOK_OF_KIND",
    "install_hint",
    "first_party_provider",
]

Kind = Literal["energy", "sampler", "integrator", "loss", "op", "kernel"]
KINDS: tuple[str, ...] = get_args(Kind)

_NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")

FIRST_PARTY_DISTRIBUTIONS = frozenset({"ebmcore", "ebm-samplers", "ebm-losses", "ebm-cuda"})
"""The distributions of this project: their components and commands win name clashes with other plugins'."""


@dataclass(frozen=True)
class Provider:
    """Who registers: the plugin's name and the distribution (and version) that shipped it."""

    plugin: str
    distribution: str
    version: str


@dataclass(frozen=True)
class Entry:
    """One registered component. Calling the entry calls the component (a factory or class)."""

    kind: str
    name: str
    component: Any
    plugin: str
    distribution: str
    version: str
    override: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Build the component; arguments its signature does not take are an :class:`InputError` naming those it takes."""
        try:
            signature = inspect.signature(self.component)
        except (TypeError, ValueError):  # no signature to check against (a builtin): let the call decide
            signature = None
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                takes = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
                raise InputError(
                    f"{self.kind} '{self.name}' ({getattr(self.component, '__name__', self.component)}): {exc}; "
                    f"it takes {', '.join(takes) or 'no arguments'}."
                ) from None
        return self.component(*args, **kwargs)

    def describe(self) -> str:
        """One line for messages: ``<kind> '<name>' from plugin '<plugin>' (<distribution> <version>)``."""
        return f"{self.kind} '{self.name}' from plugin '{self.plugin}' ({self.distribution} {self.version})"


HOOK_OF_KIND = {
    "energy": "ebm_register_energies",
    "sampler": "ebm_register_samplers",
    "integrator": "ebm_register_integrators",
    "loss": "ebm_register_losses",
    "op": "ebm_register_ops",
    "kernel": "ebm_register_kernels",
}


class Registrar:
    """Handed to one plugin's ``ebm_register_<kind>`` hook; records entries on its behalf.

    Entries are committed only if the hook returns normally, so a plugin that
    raises half-way leaves nothing behind.
    """

    def __init__(self, kind: str, provider: Provider) -> None:
        self.kind = kind
        self.provider = provider
        self.entries: list[Entry] = []

    def _add(self, kind: str, name: str, component: Any, override: bool) -> None:
        if kind != self.kind:
            raise PluginError(
                f"plugin '{self.provider.plugin}' registered {kind} '{name}' from "
                f"{HOOK_OF_KIND[self.kind]}; register {kind} components from {HOOK_OF_KIND[kind]}."
            )
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginError(
                f"plugin '{self.provider.plugin}' registered {kind} name {name!r}: names are lower-case "
                "strings of letters, digits, '_', '-' or '.', starting with a letter."
            )
        if any(e.name == name for e in self.entries):
            raise PluginError(f"plugin '{self.provider.plugin}' registered {kind} '{name}' twice.")
        p = self.provider
        self.entries.append(Entry(kind, name, component, p.plugin, p.distribution, p.version, override))

    def _callable(self, kind: str, name: str, factory: Any) -> Any:
        if not callable(factory):
            raise PluginError(
                f"plugin '{self.provider.plugin}' registered {kind} '{name}' with {factory!r}, "
                "which is not callable; register a class or a factory function."
            )
        return factory

    def register_energy(self, name: str, factory: Callable[..., Any], *, override: bool = False) -> None:
        """Register ``factory(**params) -> EnergyModel`` as energy ``name``."""
        self._add("energy", name, self._callable("energy", name, factory), override)

    def register_sampler(self, name: str, factory: Callable[..., Any], *, override: bool = False) -> None:
        """Register ``factory(energy, **params) -> Sampler`` as sampler ``name``."""
        self._add("sampler", name, self._callable("sampler", name, factory), override)

    def register_integrator(self, name: str, factory: Callable[..., Any], *, override: bool = False) -> None:
        """Register ``factory(**params) -> Integrator`` as integrator ``name``."""
        self._add("integrator", name, self._callable("integrator", name, factory), override)

    def register_loss(self, name: str, factory: Callable[..., Any], *, override: bool = False) -> None:
        """Register ``factory(**params) -> Loss`` as loss ``name``."""
        self._add("loss", name, self._callable("loss", name, factory), override)

    def register_op(self, op: Any, *, override: bool = False) -> None:
        """Register a :class:`ebmcore.kernels.fused.FusedOp` under ``op.name`` (``feedforward.langevin_chain``)."""
        from ebmcore.kernels.fused import FusedOp

        if not isinstance(op, FusedOp):
            raise PluginError(
                f"plugin '{self.provider.plugin}' registered {op!r} as an op; pass an instance of ebmcore.kernels.fused.FusedOp."
            )
        self._add("op", op.name, op, override)

    def register_kernel_backend(self, backend: Any, *, override: bool = False) -> None:
        """Register a :class:`ebmcore.KernelBackend` under ``backend.name``."""
        from ebmcore.kernels.base import KernelBackend

        if not isinstance(backend, KernelBackend):
            raise PluginError(
                f"plugin '{self.provider.plugin}' registered {backend!r} as a kernel backend; "
                "pass an instance of ebmcore.KernelBackend."
            )
        self._add("kernel", backend.name, backend, override)


@dataclass
class ComponentTable:
    """All committed entries of one loading session, with name clashes resolved.

    A name registered by several plugins resolves to the one that declared
    ``override=True`` if exactly one did; otherwise looking it up raises
    :class:`DuplicateComponentError` naming every provider.
    """

    _by_name: dict[tuple[str, str], list[Entry]] = field(default_factory=dict)

    def add(self, entries: list[Entry]) -> None:
        """Record committed entries; clashing names are kept side by side and resolved at lookup."""
        for entry in entries:
            self._by_name.setdefault((entry.kind, entry.name), []).append(entry)

    @staticmethod
    def _settle(found: list[Entry]) -> Entry | None:
        """The entry that wins a clash: the one that declared ``override=True``, else the first-party one; None if
        neither settles it."""
        overriding = [e for e in found if e.override]
        if len(overriding) == 1:
            return overriding[0]
        first_party = [e for e in found if e.distribution in FIRST_PARTY_DISTRIBUTIONS]
        return first_party[0] if not overriding and len(first_party) == 1 else None

    def _winner(self, kind: str, name: str) -> Entry:
        found = self._by_name[(kind, name)]
        if len(found) == 1:
            return found[0]
        winner = self._settle(found)
        if winner is not None:
            return winner
        overriding = [e for e in found if e.override]
        providers = "; ".join(e.describe() for e in found)
        fix = (
            "uninstall one of them, block one with EBM_DISABLE_PLUGINS=<plugin>, or have one register with override=True"
            if not overriding
            else "only one plugin may declare override=True for a name; uninstall or block the others"
        )
        raise DuplicateComponentError(f"{kind} '{name}' is registered by more than one plugin: {providers}. Fix: {fix}.")

    def conflicts(self) -> list[tuple[str, str, list[Entry]]]:
        """Names that several plugins registered and that neither one override nor one first-party entry settles."""
        return [
            (kind, name, found) for (kind, name), found in self._by_name.items() if len(found) > 1 and self._settle(found) is None
        ]

    def shadowed(self) -> list[tuple[str, str, Entry, list[Entry]]]:
        """Settled clashes: ``(kind, name, winner, losers)`` for every name several plugins registered."""
        out = []
        for (kind, name), found in self._by_name.items():
            winner = self._settle(found) if len(found) > 1 else None
            if winner is not None:
                out.append((kind, name, winner, [e for e in found if e is not winner]))
        return out

    def names(self, kind: str) -> list[str]:
        """Sorted names registered for ``kind``, clashing ones included."""
        _check_kind(kind)
        return sorted(name for (k, name) in self._by_name if k == kind)

    def entries(self, kind: str) -> list[Entry]:
        """The winning entry of every unambiguous name of ``kind`` (clashing names are left out)."""
        out = []
        for name in self.names(kind):
            try:
                out.append(self._winner(kind, name))
            except DuplicateComponentError:
                continue
        return out

    def get(self, kind: str, name: str, failures: str = "") -> Entry:
        """The entry ``name`` resolves to for ``kind``.

        Raises :class:`UnknownComponentError` (with ``failures``, a summary of plugins that failed to load, appended)
        if nothing has that name, :class:`DuplicateComponentError` if a clash is not settled by one override.
        """
        _check_kind(kind)
        if (kind, name) in self._by_name:
            return self._winner(kind, name)
        raise UnknownComponentError(_unknown_message(kind, name, self.names(kind), failures))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UnknownComponentError(f"unknown component kind {kind!r}; the kinds are {', '.join(KINDS)}.")


_CHECKOUT_PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@functools.lru_cache(maxsize=None)
def declared_plugins() -> dict[str, tuple[str, dict[str, tuple[str, ...]]]]:
    """``distribution -> (folder, {kind or "command": names})``: what each plugin of the source checkout ebm runs
    from declares it provides (``[tool.ebm.provides]`` of ``plugins/*/pyproject.toml``), read once; empty where ebm
    is not run from a checkout. The plugins say it, in their own metadata: the core lists no component."""
    found: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {}
    for pyproject in sorted(_CHECKOUT_PLUGINS.glob("*/pyproject.toml")):
        try:
            data = tomllib.loads(pyproject.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        provides = data.get("tool", {}).get("ebm", {}).get("provides", {})
        name = data.get("project", {}).get("name")
        if name and isinstance(provides, dict):
            found[name] = (pyproject.parent.name, {k: tuple(v) for k, v in provides.items() if isinstance(v, list)})
    return found


def first_party_provider(kind: str, name: str) -> str | None:
    """The plugin of the source checkout that declares ``name`` of ``kind`` (``"command"`` for ``ebm`` subcommands),
    if any (:func:`declared_plugins`)."""
    for dist, (_, provided) in declared_plugins().items():
        if name in provided.get(kind, ()):
            return dist
    return None


def install_hint(dist: str) -> str:
    """How to install the plugin distribution ``dist``: from the source checkout ebm runs from first (the packages
    may not be published where it runs; :func:`declared_plugins`), else from the package index."""
    declared = declared_plugins().get(dist)
    if declared is not None:
        return (
            f"install it from this checkout with `pip install -e {_CHECKOUT_PLUGINS / declared[0]}` "
            f"(where it is published: `pip install {dist}`)"
        )
    return f"install it with `pip install {dist}` (from a source checkout: `pip install -e plugins/{dist.replace('-', '_')}`)"


def _unknown_message(kind: str, name: str, available: list[str], failures: str) -> str:
    lines = [f"no {kind} named {name!r}. Available {kind} names: {', '.join(available) or '(none)'}."]
    close = difflib.get_close_matches(name, available, n=1)
    if close:
        lines.append(f"Did you mean {close[0]!r}?")
    dist = first_party_provider(kind, name)
    if dist:
        lines.append(f"{kind} {name!r} is provided by the plugin {dist}: {install_hint(dist)}.")
    if failures:
        lines.append("These plugins failed to load and may have provided it:\n" + failures)
    return "\n".join(lines)
