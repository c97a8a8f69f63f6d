"""pytest fixtures for plugin authors: ``pytest_plugins = ["ebmcore.testing.fixtures"]``."""

from __future__ import annotations

from typing import Iterator

import pytest

from ebmcore.plugins import PluginSession
from ebmcore.testing.plugins import isolated_plugins


@pytest.fixture
def ebm_plugins() -> Iterator[PluginSession]:
    """An isolated plugin session with only the builtins; register more with ``session.register``
    or ``ebmcore.register_plugin``. Restores the previous session afterwards."""
    with isolated_plugins() as session:
        yield session
