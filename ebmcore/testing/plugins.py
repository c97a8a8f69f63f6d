"""Isolated plugin sessions and throw-away installed distributions, for plugin authors' tests."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from ebmcore import plugins
from ebmcore.commands import ENTRY_POINT_GROUP as COMMANDS_GROUP
from ebmcore.config import get_config
from ebmcore.components import Provider

__all__ = ["isolated_plugins", "installed_distribution"]


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
