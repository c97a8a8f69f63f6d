"""Isolated plugin sessions and throw-away installed distributions, for plugin authors' tests."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import site
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from ebmcore import plugins
from ebmcore.commands import ENTRY_POINT_GROUP as COMMANDS_GROUP
from ebmcore.config import get_config
from ebmcore.components import FIRST_PARTY_DISTRIBUTIONS, Provider

__all__ = ["isolated_plugins", "installed_distribution", "environment_plugins", "hide_environment_plugins"]


@contextmanager
def isolated_plugins(*extra: Any, autoload: bool = False, disable: tuple[str, ...] = ()) -> Iterator[plugins.PluginSession]:
    """A fresh plugin session for the block: the builtins, ``extra`` plugin objects, and
    (with ``autoload=True``) the installed entry points minus ``disable``. The previous
    session and kernel choices are restored afterwards.

    ``extra`` items are modules/objects with ``@ebmcore.hookimpl`` functions, or
    ``(name, plugin)`` pairs.
    """
    config = dataclasses.replace(get_config(), disable_plugin_autoload=not autoload, disable_plugins=frozenset(disable))
    saved = plugins._session
    session = plugins.PluginSession(config).load()
    for item in extra:
        name, plugin = item if isinstance(item, tuple) else (getattr(item, "__name__", type(item).__name__), item)
        session.register(plugin, name, Provider(name, "__test__", "0"))
    plugins._session = session
    try:
        yield session
    finally:
        plugins._session = saved


@contextmanager
def installed_distribution(
    root: Path,
    name: str,
    version: str,
    entry_points: Mapping[str, str],
    files: Mapping[str, str],
    commands: Mapping[str, str] | None = None,
) -> Iterator[Path]:
    """Install a minimal distribution into ``root`` and put it on ``sys.path`` for the block.

    ``entry_points`` maps entry-point names in the ``ebmcore`` group to
    ``"module:attr"`` or ``"module"``; ``files`` maps paths relative to
    ``root`` to source text; ``commands`` maps entry-point names in the
    ``ebmcore.commands`` group (the ``ebm`` subcommands a plugin declares,
    :mod:`ebmcore.commands`) likewise. The distribution has real ``.dist-info``
    metadata, so ``importlib.metadata`` finds it exactly like a pip-installed
    package. Its modules are removed from ``sys.modules`` afterwards.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    declared = "".join(f"{k} = {v}\n" for k, v in (commands or {}).items())
    declared = f"\n[{COMMANDS_GROUP}]\n{declared}" if commands is not None else ""
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{eps}{declared}")
    (info / "RECORD").write_text("")
    top = {Path(rel).parts[0].removesuffix(".py") for rel in files}
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for mod in set(sys.modules) - before:
            if mod.split(".")[0] in top:
                del sys.modules[mod]


_ENTRY_POINTS = importlib.metadata.entry_points  # as installed, whatever a test patches


@functools.lru_cache(maxsize=1)
def _site_packages() -> frozenset[Path]:
    return frozenset(Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()])


def _from_environment(dist: Any) -> bool:
    """Whether ``dist`` is a third-party distribution installed in this Python's site-packages."""
    return (
        dist is not None
        and dist.name not in FIRST_PARTY_DISTRIBUTIONS
        and Path(dist.locate_file("")).resolve() in _site_packages()
    )


def environment_plugins() -> frozenset[str]:
    """The distributions installed in this Python's site-packages that plug into ebmcore (entry points of the groups
    ``ebmcore`` or ``ebmcore.commands``) and are not ebm's own: what a user installed beside ebm, such as the plugin
    guide's example."""
    return frozenset(
        ep.dist.name
        for group in (plugins.ENTRY_POINT_GROUP, COMMANDS_GROUP)
        for ep in _ENTRY_POINTS(group=group)
        if _from_environment(ep.dist)
    )


def hide_environment_plugins(monkeypatch: Any) -> None:
    """``importlib.metadata.entry_points`` of the ebmcore groups without the entry points of
    :func:`environment_plugins`, for the rest of the test (``monkeypatch``: pytest's): tests that compare what ebm
    prints with what the docs show then do not depend on which third-party plugins the environment holds, while the
    distributions a test installs itself (:func:`installed_distribution`, a ``pip install --target`` folder: not
    site-packages) stay visible, even under the same name."""
    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        found = real(**params)
        if params.get("group") not in (plugins.ENTRY_POINT_GROUP, COMMANDS_GROUP):
            return found
        return type(found)(ep for ep in found if not _from_environment(ep.dist))

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
