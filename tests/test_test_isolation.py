"""The repository's autouse fixture (conftest.py's ``clean_ebm_state``) seen from a test of a pytest run of its own,
started with EBM_* variables set: it clears those that change what ebm does, and keeps the one that only says where a
cache lives, so that a carried build of the CUDA kernels (``EBM_CUDA_CACHE``, docs/cuda.md) is used, not rebuilt."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STARTED_WITH = {
    "EBM_CUDA_CACHE": "/carried/ebm_cuda",
    "EBM_BACKEND": "torch",
    "EBM_CUDA_HOST_LIBRARY": "/elsewhere/libebm_host.so",
}
PROBE = """
import json, os

def test_probe():
    with open(os.environ["ISOLATION_PROBE_OUT"], "w") as f:
        json.dump({k: v for k, v in os.environ.items() if k.startswith("EBM_")}, f)
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, str]:
    """The EBM_* variables a test sees in a pytest run started with STARTED_WITH, under this repository's conftest.py
    (loaded as a plugin: the probe lies outside the tree)."""
    tmp = tmp_path_factory.mktemp("isolation")
    (tmp / "test_probe.py").write_text(PROBE)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EBM_")},
        **STARTED_WITH,
        "ISOLATION_PROBE_OUT": str(tmp / "seen.json"),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "test_probe.py"]
    run = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((tmp / "seen.json").read_text())


def test_a_test_sees_where_the_cuda_build_cache_is(seen):
    assert seen.get("EBM_CUDA_CACHE") == STARTED_WITH["EBM_CUDA_CACHE"]


def test_a_test_sees_no_variable_that_changes_what_ebm_does(seen):
    assert set(seen) <= {"EBM_CUDA_CACHE"}, seen  # EBM_BACKEND and EBM_CUDA_HOST_LIBRARY are cleared


def test_a_third_party_plugin_of_the_environment_is_hidden_and_one_a_test_installs_is_not(tmp_path, monkeypatch, capsys):
    """Following docs/plugins.md installs its example plugin beside ebm; the tests that compare what ebm prints with the
    docs then failed (8 of them). The autouse fixture hides what site-packages holds beyond ebm's own plugins
    (``hide_environment_plugins``); a distribution a test installs elsewhere stays visible. Here a folder stands in for
    site-packages."""
    import ebmcore
    from ebmcore import cli, plugins
    from ebmcore.testing import installed_distribution
    from ebmcore.testing import plugins as testing_plugins

    site, elsewhere = tmp_path / "site-packages", tmp_path / "target"
    monkeypatch.setattr(testing_plugins, "_site_packages", lambda: frozenset({site.resolve()}))
    plugin = """
        import ebmcore
        from ebm_samplers import LangevinSampler

        @ebmcore.hookimpl
        def ebm_register_samplers(registry):
            registry.register_sampler("{name}", LangevinSampler)
        """
    with (
        installed_distribution(
            site,
            "users-plugin",
            "1.0",
            {"users": "users_plugin"},
            {"users_plugin.py": plugin.format(name="users_sampler")},
            commands={},
        ),
        installed_distribution(
            elsewhere,
            "tests-plugin",
            "2.0",
            {"tests": "tests_plugin"},
            {"tests_plugin.py": plugin.format(name="tests_sampler")},
            commands={},
        ),
    ):
        assert testing_plugins.environment_plugins() == {"users-plugin"}
        plugins.reset()  # the autouse fixture's filter asks where each distribution lies at every look-up
        assert "tests_sampler" in ebmcore.registry.names("sampler")
        assert "users_sampler" not in ebmcore.registry.names("sampler")
        assert cli.main(["--version"]) == 0
        version = capsys.readouterr().out
        assert "tests-plugin 2.0" in version and "users-plugin" not in version
    plugins.reset()
