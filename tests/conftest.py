"""Shared fixtures: every test starts from a clean environment, working directory and plugin session."""

from __future__ import annotations

import os

import pytest

import ebmcore.config
from ebmcore import plugins

pytest_plugins = ["ebmcore.testing.fixtures"]


@pytest.fixture(autouse=True)
def clean_ebm_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """No EBM_* variables, an empty working directory, and a fresh plugin session and config."""
    for name in list(os.environ):
        if name.startswith("EBM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    ebmcore.config._config = None
    plugins.reset()
    yield
    ebmcore.config._config = None
    plugins.reset()
