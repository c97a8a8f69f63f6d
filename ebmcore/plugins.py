"""Finding and loading plugins: once, lazily, and without letting one broken plugin break the rest.

The builtin plugin (``ebmcore.builtin``) is registered first, through the same
hooks as any other. External plugins come from the entry-point group
``ebmcore``. ``EBM_DISABLE_PLUGIN_AUTOLOAD=1`` loads none of them;
``EBM_DISABLE_PLUGINS=a,b`` blocks the named entry points (both also settable
in ``ebm.toml``).
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

import importlib_metadata
import pluggy

from ebmcore import hookspecs
from ebmcore.registry import KINDS, ComponentTable, Provider, Registrar, _HOOK_OF_KIND

__all__ = ["PluginRecord", "PluginSession", "session", "reset", "register_plugin", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "ebmcore"
BUILTIN = "builtin"


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

    def fail(self, stage: str, exc: BaseException) -> None:
        self.status = "failed"
        message = f"{stage}: {type(exc).__name__}: {exc}"
        self.error = f"{self.error}; {message}" if self.error else message
        self.traceback += "".join(traceback.format_exception(exc))


class PluginSession:
    """One loading of all plugins: the pluggy manager, the records and the component table."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.table = ComponentTable()

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> "PluginSession":
        from ebmcore import __version__, builtin

        self.register(builtin, BUILTIN, Provider(BUILTIN, "ebmcore", __version__))
        if not self.config.disable_plugin_autoload:
            for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
                self._load_entry_point(ep)
        return self

    def _load_entry_point(self, ep: Any) -> None:
        dist = ep.dist.name if ep.dist is not None else "(unknown distribution)"
        version = ep.dist.version if ep.dist is not None else "?"
        if ep.name in self.records and self.records[ep.name].distribution == dist:
            return  # the same distribution seen twice on sys.path
        record = PluginRecord(ep.name, dist, version)
        if ep.name in self.config.disable_plugins:
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
        except BaseException as exc:  # noqa: BLE001 - a broken plugin must not break the core
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            record.fail("import", exc)
            self.records[ep.name] = record
            return
        self.register(plugin, ep.name, Provider(ep.name, dist, version), record)

    def register(
        self, plugin: Any, name: str, provider: Provider, record: PluginRecord | None = None
    ) -> PluginRecord:
        """Register ``plugin`` with pluggy and run its hooks (configure, then registration), isolating failures."""
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
        self._call(name, record, "ebm_configure", config=self.config)
        for kind in KINDS:
            registrar = Registrar(kind, provider)
            if self._call(name, record, _HOOK_OF_KIND[kind], registry=registrar):
                self.table.add(registrar.entries)
                if registrar.entries:
                    record.provides[kind] = [e.name for e in registrar.entries]
        return record

    def _call(self, name: str, record: PluginRecord, hook: str, **kwargs: Any) -> bool:
        """Call plugin ``name``'s implementation of ``hook`` (if any) with the arguments it asks for."""
        for impl in getattr(self.manager.hook, hook).get_hookimpls():
            if impl.plugin_name != name:
                continue
            try:
                impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception as exc:  # noqa: BLE001 - recorded, quoted by lookups
                record.fail(hook, exc)
                return False
        return True

    def add_commands(self, subparsers: Any) -> None:
        """Let every loaded plugin add ``ebm`` subcommands (failures are recorded, not raised)."""
        for name, record in list(self.records.items()):
            if record.status == "loaded":
                self._call(name, record, "ebm_add_commands", subparsers=subparsers)

    # -- reporting -----------------------------------------------------------------------------

    def failures(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == "failed"]

    def failure_summary(self) -> str:
        return "\n".join(f"  - {r.name} ({r.distribution} {r.version}): {r.error}" for r in self.failures())


_lock = threading.RLock()
_session: PluginSession | None = None


def session() -> PluginSession:
    """The loaded plugin session, loading it on first use (thread-safe, once)."""
    global _session
    s = _session
    if s is not None:
        return s
    with _lock:
        if _session is None:
            from ebmcore.config import get_config

            _session = PluginSession(get_config()).load()
            _on_reload()
        return _session


def reset() -> None:
    """Forget the loaded plugins (and cached kernel choices); the next lookup loads them again."""
    global _session
    with _lock:
        _session = None
        _on_reload()


def register_plugin(plugin: Any, name: str | None = None) -> PluginRecord:
    """Register a plugin object at run time (a module or object with ``@hookimpl`` functions).

    For notebooks and tests; packages should use the ``ebmcore`` entry-point
    group instead. The entries are attributed to the ``__main__`` distribution.
    """
    s = session()
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    with _lock:
        record = s.register(plugin, name, Provider(name, "__main__", "0"))
        _on_reload()
    return record


def _on_reload() -> None:
    from ebmcore.kernels import resolve

    resolve.clear_cache()
