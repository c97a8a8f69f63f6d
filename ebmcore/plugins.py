"""Finding and loading plugins: once, lazily, and without letting one broken plugin break the rest.

Every plugin comes from the entry-point group ``ebmcore``, the core's own builtin plugin
(``ebmcore.builtin``, entry point ``builtin`` of the ``ebmcore`` distribution) included: it is
loaded first and always, then the others. ``EBM_DISABLE_PLUGIN_AUTOLOAD=1`` loads none of the
others; ``EBM_DISABLE_PLUGINS=a,b`` blocks the named entry points (both also settable in
``ebm.toml``). Each plugin's hooks are called by pluggy, for that plugin alone, so that one whose
hook raises is recorded as failed and the others are unaffected.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata  # the standard library has what this uses (EntryPoint.dist) from Python 3.10
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy

from ebmcore import config, hookspecs
from ebmcore.version import __version__
from ebmcore.components import FIRST_PARTY_DISTRIBUTIONS, HOOK_OF_KIND, KINDS, ComponentTable, Provider, Registrar

__all__ = ["PluginRecord", "PluginSession", "session", "loaded", "reset", "register_plugin", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "ebmcore"
CORE_DISTRIBUTION = "ebmcore"
BUILTIN_MODULE = "ebmcore.builtin"


@dataclass
class PluginRecord:
    """What happened to one plugin: loaded, blocked, or failed (with the error)."""

    name: str
    distribution: str
    version: str
    status: Literal["loaded", "failed", "blocked"] = "loaded"
    error: str = ""
    traceback: str = ""
    provides: dict[str, list[str]] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    """The ``ebm`` subcommands it added (filled when ``ebm`` builds its parser)."""

    def fail(self, stage: str, exc: BaseException) -> None:
        self.status = "failed"
        message = f"{stage}: {type(exc).__name__}: {exc}"
        self.error = f"{self.error}; {message}" if self.error else message
        self.traceback += "".join(traceback.format_exception(exc))


class PluginSession:
    """One loading of all plugins: the pluggy manager, the records and the component table."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.config_generation = _config_generation()
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.table = ComponentTable()
        self.command_clashes: list[tuple[str, str, str]] = []
        """``(command, winner, loser)`` for every ``ebm`` subcommand name a later plugin tried to take (see :meth:`add_commands`)."""
        self.kernel_cache: dict[tuple[Any, ...], Any] = {}
        """Kernel choices of :func:`ebmcore.resolve_kernel` with these plugins (a new session starts empty)."""

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> "PluginSession":
        """Load the core's own entry points, then (unless autoload is off) every other one."""
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        core = [ep for ep in found if ep.dist is not None and ep.dist.name == CORE_DISTRIBUTION]
        for ep in core:
            self._load_entry_point(ep)
        if not core:  # metadata from before the entry point (an old editable install): load it by its name
            self.register(importlib.import_module(BUILTIN_MODULE), "builtin", Provider("builtin", CORE_DISTRIBUTION, __version__))
        if not self.config.disable_plugin_autoload:
            for ep in found:
                if ep not in core:
                    self._load_entry_point(ep)
        return self

    def _load_entry_point(self, ep: Any) -> None:
        dist = ep.dist.name if ep.dist is not None else "(unknown distribution)"
        version = ep.dist.version if ep.dist is not None else "?"
        if ep.name in self.records and self.records[ep.name].distribution == dist:
            return  # the same distribution seen twice on sys.path
        record = PluginRecord(ep.name, dist, version)
        if ep.name in self.config.disable_plugins and dist != CORE_DISTRIBUTION:
            record.status = "blocked"
            record.error = "blocked by EBM_DISABLE_PLUGINS / disable_plugins"
            self.records.setdefault(ep.name, record)
            return
        if ep.name in self.records:
            other = self.records[ep.name]
            record.fail(
                "register",
                ValueError(
                    f"plugin name '{ep.name}' is already taken by {other.distribution} {other.version}; "
                    "uninstall one of the two distributions"
                ),
            )
            self.records[f"{ep.name} ({dist})"] = record
            return
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken plugin (even one calling sys.exit) must not break the core
            record.fail("import", exc)
            self.records[ep.name] = record
            return
        self.register(plugin, ep.name, Provider(ep.name, dist, version), record)

    def register(self, plugin: Any, name: str, provider: Provider, record: PluginRecord | None = None) -> PluginRecord:
        """Register ``plugin`` with pluggy and run its registration hooks, isolating failures."""
        record = record or PluginRecord(name, provider.distribution, provider.version)
        if name in self.records or self.manager.has_plugin(name):
            record.fail("register", ValueError(f"a plugin named '{name}' is already registered; choose another name"))
            record.name = f"{name} (duplicate)"
            self.records[record.name] = record
            return record
        self.records[name] = record
        try:
            self.manager.register(plugin, name=name)
        except Exception as exc:  # pluggy validation errors: bad hook signatures
            record.fail("register", exc)
            return record
        unknown = [h.name for h in self.manager.get_hookcallers(plugin) or [] if h.spec is None]
        if unknown:
            self.manager.unregister(plugin)
            known = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("ebm_")))
            record.fail("register", ValueError(f"unknown hook(s) {', '.join(unknown)}; ebmcore's hooks are {known}"))
            return record
        for kind in KINDS:
            registrar = Registrar(kind, provider)
            if self._call(plugin, record, HOOK_OF_KIND[kind], registry=registrar):
                self.table.add(registrar.entries)
                if registrar.entries:
                    record.provides[kind] = [e.name for e in registrar.entries]
        return record

    def _call(self, plugin: Any, record: PluginRecord, hook: str, **kwargs: Any) -> bool:
        """Have pluggy call ``plugin``'s implementation of ``hook`` (if any), and only its; False if it raised."""
        others = [p for p in self.manager.get_plugins() if p is not plugin]
        try:
            self.manager.subset_hook_caller(hook, remove_plugins=others)(**kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - recorded, quoted by lookups (sys.exit in a hook included)
            record.fail(hook, exc)
            return False
        return True

    def add_commands(self, subparsers: Any) -> None:
        """Let every loaded plugin add ``ebm`` subcommands (failures are recorded, not raised).

        The first-party plugins add theirs first, and a command name that is taken (by the core or an earlier
        plugin) is not replaced: the later plugin's parser for it is left unused and the clash is recorded in
        :attr:`command_clashes` as ``(command, winner, loser)``."""
        owners = {name: "ebmcore" for name in subparsers.choices}
        self.command_clashes = []
        first_party = sorted(self.records.items(), key=lambda item: item[1].distribution not in FIRST_PARTY_DISTRIBUTIONS)
        for name, record in first_party:
            plugin = self.manager.get_plugin(name)
            if record.status == "loaded" and plugin is not None:
                guarded = _Subcommands(subparsers, record, owners, self.command_clashes)
                self._call(plugin, record, "ebm_add_commands", subparsers=guarded)

    # -- reporting -----------------------------------------------------------------------------

    def failures(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "failed"]

    def failure_summary(self) -> str:
        return "\n".join(f"  - {r.name} ({r.distribution} {r.version}): {r.error}" for r in self.failures())


class _Subcommands:
    """``ebm``'s sub-parsers as one plugin's ``ebm_add_commands`` sees them: a taken name is not replaced."""

    def __init__(
        self, subparsers: Any, record: PluginRecord, owners: dict[str, str], clashes: list[tuple[str, str, str]]
    ) -> None:
        self._subparsers, self._record, self._owners, self._clashes = subparsers, record, owners, clashes

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        names = [name, *kwargs.get("aliases", ())]
        taken = [n for n in names if n in self._owners]
        who = f"{self._record.name} ({self._record.distribution})"
        if taken:
            for n in taken:
                self._clashes.append((n, self._owners[n], who))
            return argparse.ArgumentParser(prog=f"ebm {name} (unused: taken by {self._owners[taken[0]]})", add_help=False)
        parser = self._subparsers.add_parser(name, **kwargs)
        for n in names:
            self._owners[n] = who
        self._record.commands += [n for n in names if n not in self._record.commands]  # main() builds it at every call
        return parser

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._subparsers, attribute)


_lock = threading.RLock()
_session: PluginSession | None = None


def _config_generation() -> int:
    return config.generation()


def session() -> PluginSession:
    """The loaded plugin session, loading it on first use and again after the configuration is
    reloaded (thread-safe, once each)."""
    global _session
    s = _session
    if s is not None and s.config_generation == _config_generation():
        return s
    with _lock:
        if _session is None or _session.config_generation != _config_generation():
            _session = PluginSession(config.get_config()).load()
        return _session


def loaded() -> bool:
    """Whether the plugins are loaded in this process (a lookup, ``register_plugin`` or ``ebm``'s whole parser did it)."""
    return _session is not None


def reset() -> None:
    """Forget the loaded plugins (and their cached kernel choices); the next lookup loads them again."""
    global _session
    with _lock:
        _session = None


def register_plugin(plugin: Any, name: str | None = None) -> PluginRecord:
    """Register a plugin object at run time (a module or object with ``@hookimpl`` functions).

    For notebooks and tests; packages should use the ``ebmcore`` entry-point
    group instead. The entries are attributed to the ``__main__`` distribution.
    """
    s = session()
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    with _lock:
        record = s.register(plugin, name, Provider(name, "__main__", "0"))
        s.kernel_cache.clear()
    return record
