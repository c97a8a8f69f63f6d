"""``ebmcore``'s exports are imported on first use (PEP 562): the three lists of them (the ``TYPE_CHECKING`` imports
for type checkers, ``_LAZY`` for the import, ``__all__``) must name the same things, and each must resolve to what the
static import names."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import ebmcore


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of the imports under ``if TYPE_CHECKING:`` in ebmcore/__init__.py."""
    tree = ast.parse(Path(ebmcore.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            names[alias.asname or alias.name] = node.module if node.module != "ebmcore" else f"ebmcore.{alias.name}"
    return names


def test_the_lazy_exports_the_static_imports_and_all_agree():
    static = _type_checking_imports()
    assert set(static) == set(ebmcore._LAZY)
    assert set(ebmcore.__all__) == set(ebmcore._LAZY) | {"__version__", "energy"}
    for name, module in static.items():
        expected = importlib.import_module(module)
        expected = expected if module == f"ebmcore.{name}" else getattr(expected, name)
        assert getattr(ebmcore, name) is expected, name
