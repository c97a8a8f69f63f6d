"""The ``ebm`` subcommands each plugin declares, read without importing the plugins (nor torch).

A plugin adds its subcommands through the ``ebm_add_commands`` hook, which needs the plugin imported. So that
``ebm --help`` can list them without that, a plugin also declares them: an entry point of the group
``ebmcore.commands`` with the same name as its entry point of the group ``ebmcore``, naming a dict
``{command: one-line help}`` in the order the hook adds them::

    [project.entry-points."ebmcore.commands"]
    my_plugin = "my_package.commands:COMMANDS"   # {} for a plugin that adds none

The module is read from its file without running its package's ``__init__`` (which would import the plugin and
torch), so it imports nothing; the plugin's parsers take their help from the same dict. ``ebm --help`` builds the
whole parser, plugins imported, when some plugin that loads has no declaration (``ebmcore.cli``).

The same module may also declare each command's arguments, so that ``ebm COMMAND --help`` prints without importing
the plugin or torch either: a dict ``ARGUMENTS = {command: function}``, where ``function(parser)`` adds the command's
arguments (and sub-commands) to its ``argparse`` parser, importing nothing that imports torch. The plugin's
``ebm_add_commands`` hook calls the same function on the parser it adds and then sets ``func``, so that the two
parsers are one text. A command without an entry in ``ARGUMENTS`` gets its ``--help`` from the whole parser.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, NamedTuple

__all__ = ["ENTRY_POINT_GROUP", "BUILTIN", "Declaration", "declared_commands", "read_declaration", "read_declarations"]

ENTRY_POINT_GROUP = "ebmcore.commands"

BUILTIN: dict[str, str] = {}
"""The core's builtin plugin adds no subcommand (``ebm plugins``, ``backends`` and ``demo`` are the core's parser's)."""


def _module_alone(name: str) -> ModuleType:
    """The module ``name`` executed from its file, its parent packages found but not imported."""
    if name in sys.modules:
        return sys.modules[name]
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name is found without being imported
    for i in range(len(rest)):
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join([top, *rest[: i + 1]]), spec.submodule_search_locations)
    if spec is None or spec.loader is None or spec.name != name:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared_commands(plugin: str, distribution: str) -> dict[str, str] | None:
    """``{command: one-line help}`` that the plugin entry point ``plugin`` of ``distribution`` declares, or None where
    it declares nothing or its declaration cannot be read (then only the full parser knows its commands)."""
    return read_declaration(plugin, distribution)[0]


def read_declaration(plugin: str, distribution: str) -> tuple[dict[str, str] | None, str]:
    """``(commands, "")`` as :func:`declared_commands`, or ``(None, why)`` where a declaration exists but cannot be read:
    its module fails to run (an exception, or ``sys.exit`` in it: a ``SystemExit`` must not end ``ebm --help``; a
    ``KeyboardInterrupt`` still interrupts) or does not hold a dict of strings."""
    declaration = read_declarations(plugin, distribution)
    return declaration.commands, declaration.why


class Declaration(NamedTuple):
    """What a plugin declares for ``ebm``: ``commands`` (``{command: one-line help}``, None where it declares nothing
    or the declaration cannot be read, ``why`` then saying why), and ``arguments`` (``{command: function(parser)}``
    from the same module's ``ARGUMENTS``, for the declared commands only; empty where it has none)."""

    commands: dict[str, str] | None
    arguments: dict[str, Callable[[Any], Any]]
    why: str


def read_declarations(plugin: str, distribution: str) -> Declaration:
    """The :class:`Declaration` of the plugin entry point ``plugin`` of ``distribution``, its module run once."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == plugin and ep.dist is not None and ep.dist.name == distribution:
            try:
                module: Any = _module_alone(ep.module)
                found = module
                for attribute in (ep.attr or "").split("."):
                    found = getattr(found, attribute) if attribute else found
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a broken declaration (even one calling sys.exit)
                return Declaration(None, {}, f"{ep.value} cannot be read ({type(exc).__name__}: {exc})")
            if isinstance(found, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
                arguments = getattr(module, "ARGUMENTS", None)
                if not isinstance(arguments, dict):  # none, or not a dict: every command's --help is the whole parser's
                    arguments = {}
                return Declaration(dict(found), {k: f for k, f in arguments.items() if k in found and callable(f)}, "")
            return Declaration(None, {}, f"{ep.value} is a {type(found).__name__}, not a dict {{command: one-line help}}")
    return Declaration(None, {}, "")
