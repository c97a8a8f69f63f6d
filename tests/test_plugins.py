"""Plugin loading: lazy and once, isolated failures, environment switches."""

import argparse
from importlib import metadata as importlib_metadata

import pytest

import ebmcore
from ebmcore import plugins, registry
from ebmcore.cli import main
from ebmcore.errors import UnknownComponentError
from ebmcore.testing import installed_distribution

GOOD = """
import ebmcore

@ebmcore.hookimpl
def ebm_register_energies(registry):
    registry.register_energy("good_energy", ebmcore.HarmonicEnergy)
"""

BROKEN_IMPORT = """
import not_a_module_that_exists
"""

BROKEN_REGISTER = """
import ebmcore

@ebmcore.hookimpl
def ebm_register_energies(registry):
    registry.register_energy("half_registered", ebmcore.HarmonicEnergy)
    raise RuntimeError("registration exploded")
"""


@pytest.fixture
def dists(tmp_path):
    with (
        installed_distribution(tmp_path / "good", "good-plugin", "2.0", {"good": "good_plugin"}, {"good_plugin.py": GOOD}),
        installed_distribution(tmp_path / "bad", "bad-plugin", "0.1", {"bad": "bad_plugin"}, {"bad_plugin.py": BROKEN_IMPORT}),
        installed_distribution(
            tmp_path / "half", "half-plugin", "0.2", {"half": "half_plugin"}, {"half_plugin.py": BROKEN_REGISTER}
        ),
    ):
        plugins.reset()
        yield


def test_plugins_load_lazily_and_once(monkeypatch):
    calls = []
    real = importlib_metadata.entry_points
    monkeypatch.setattr(importlib_metadata, "entry_points", lambda **kw: calls.append(kw) or real(**kw))
    plugins.reset()
    assert calls == []  # nothing happens until a lookup
    registry.names("energy")
    registry.get("energy", "gaussian")
    registry.names("kernel")
    assert calls == [{"group": "ebmcore"}]


def test_a_plugin_that_fails_to_import_is_recorded_and_the_rest_still_work(dists):
    s = plugins.session()
    assert s.records["good"].status == "loaded" and s.records["good"].version == "2.0"
    assert s.records["bad"].status == "failed"
    assert "ModuleNotFoundError" in s.records["bad"].error and "not_a_module_that_exists" in s.records["bad"].error
    assert registry.get("energy", "good_energy").distribution == "good-plugin"
    assert registry.get("energy", "gaussian").plugin == "builtin"


def test_a_plugin_that_raises_while_registering_leaves_nothing_behind(dists):
    s = plugins.session()
    assert s.records["half"].status == "failed"
    assert "ebm_register_energies: RuntimeError: registration exploded" in s.records["half"].error
    assert "half_registered" not in registry.names("energy")


def test_looking_up_a_missing_name_quotes_the_failures(dists):
    with pytest.raises(UnknownComponentError) as err:
        registry.get("sampler", "whatever")
    msg = str(err.value)
    assert "failed to load" in msg and "bad (bad-plugin 0.1)" in msg and "not_a_module_that_exists" in msg
    assert "registration exploded" in msg


def test_ebm_plugins_shows_the_failure(dists, capsys):
    assert main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert "good-plugin 2.0" in out and "loaded" in out
    assert "bad-plugin" in out and "failed" in out and "not_a_module_that_exists" in out


def test_disable_autoload_loads_no_external_plugin(dists, monkeypatch):
    monkeypatch.setenv("EBM_DISABLE_PLUGIN_AUTOLOAD", "1")
    ebmcore.reload_config()
    assert set(plugins.session().records) == {"builtin"}
    assert "gaussian" in registry.names("energy") and "good_energy" not in registry.names("energy")


def test_disable_plugins_blocks_the_named_ones(dists, monkeypatch):
    monkeypatch.setenv("EBM_DISABLE_PLUGINS", "bad, half")
    ebmcore.reload_config()
    s = plugins.session()
    assert s.records["bad"].status == "blocked" and s.records["half"].status == "blocked"
    assert s.failures() == []
    assert "good_energy" in registry.names("energy")


def test_bad_boolean_in_environment_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("EBM_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    with pytest.raises(ebmcore.ConfigError, match="EBM_DISABLE_PLUGIN_AUTOLOAD='maybe' is not a boolean"):
        ebmcore.reload_config()


def test_register_plugin_at_run_time(ebm_plugins):
    class Notebook:
        @ebmcore.hookimpl
        def ebm_register_energies(self, registry):
            registry.register_energy("notebook_energy", ebmcore.HarmonicEnergy)

    record = ebmcore.register_plugin(Notebook(), "notebook")
    assert record.status == "loaded"
    assert registry.get("energy", "notebook_energy").plugin == "notebook"


def test_a_misspelled_hook_rejects_the_plugin_with_the_known_names(ebm_plugins):
    class Typo:
        @ebmcore.hookimpl
        def ebm_register_sampler(self, registry):  # missing "s"
            pass

    record = ebmcore.register_plugin(Typo(), "typo")
    assert record.status == "failed"
    assert "unknown hook(s) ebm_register_sampler" in record.error and "ebm_register_samplers" in record.error


def test_hooks_may_take_fewer_arguments(ebm_plugins):
    calls = []

    class Plugin:
        @ebmcore.hookimpl
        def ebm_register_energies(self):
            calls.append("register")

    assert ebmcore.register_plugin(Plugin(), "few_args").status == "loaded"
    assert calls == ["register"]


def test_registering_a_taken_name_again_keeps_the_first_plugin(ebm_plugins):
    class Plugin:
        @ebmcore.hookimpl
        def ebm_register_energies(self, registry):
            registry.register_energy("nb_energy", ebmcore.HarmonicEnergy)

    first = ebmcore.register_plugin(Plugin(), "cell")
    second = ebmcore.register_plugin(Plugin(), "cell")
    assert first.status == "loaded" and ebm_plugins.records["cell"] is first
    assert second.status == "failed" and "already registered" in second.error
    assert registry.get("energy", "nb_energy").plugin == "cell"


def test_version_with_a_bad_config_is_a_clean_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ebm.toml").write_text("nonsense = 1\n")
    assert main(["--version"]) == 2
    assert "unknown key(s) nonsense" in capsys.readouterr().err


def test_without_the_core_entry_point_the_builtins_still_load(monkeypatch):
    real = importlib_metadata.entry_points
    monkeypatch.setattr(
        importlib_metadata, "entry_points", lambda **kw: [ep for ep in real(**kw) if not (ep.dist and ep.dist.name == "ebmcore")]
    )
    plugins.reset()
    assert registry.get("energy", "gaussian").plugin == "builtin" and plugins.session().records["builtin"].status == "loaded"


EXITS_ON_IMPORT = """
import sys
sys.exit(3)
"""

TAKES_SAMPLE = """
import ebmcore

class _Mala(ebmcore.Sampler):
    def init(self, x):
        return x

    def step(self, state, **kw):
        return state, {}

@ebmcore.hookimpl
def ebm_register_samplers(registry):
    registry.register_sampler("mala", _Mala)  # a first-party name, without override=True

@ebmcore.hookimpl
def ebm_add_commands(subparsers):
    p = subparsers.add_parser("sample", help="not the real one")
    p.set_defaults(func=lambda args: 42)
    q = subparsers.add_parser("hello", help="a command of its own")
    q.set_defaults(func=lambda args: 0)
"""


def test_a_plugin_that_exits_on_import_is_recorded_and_nothing_else_breaks(tmp_path, capsys):
    with installed_distribution(tmp_path / "x", "exit-plugin", "1.0", {"exiter": "exiter"}, {"exiter.py": EXITS_ON_IMPORT}):
        plugins.reset()
        assert ebmcore.energy("gaussian", dim=2).event_shape == (2,)
        assert main(["plugins"]) == 1
        out = capsys.readouterr().out
        assert "exit-plugin 1.0" in out and "failed" in out and "import: SystemExit: 3" in out
        assert plugins.session().records["samplers"].status == "loaded"


def test_first_party_commands_and_components_win_clashes_whatever_the_install_order(tmp_path, capsys):
    # the clashing distribution comes first on sys.path, so its entry point is loaded before ebm-samplers'
    with installed_distribution(
        tmp_path / "c", "ebm-bad_command", "0.1", {"bad_command": "bad_command"}, {"bad_command.py": TAKES_SAMPLE}
    ):
        plugins.reset()
        from ebmcore import cli

        parser = cli._parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert "--n-chains" in commands["sample"].format_help()  # ebm-samplers' sample
        assert main(["hello"]) == 0  # the loser's other commands still work
        assert registry.get("sampler", "mala").distribution == "ebm-samplers"
        s = plugins.session()
        assert s.records["samplers"].status == "loaded" and s.records["bad_command"].status == "loaded"
        assert main(["plugins"]) == 0
        out = capsys.readouterr().out
        assert "SHADOWED command 'sample': samplers (ebm-samplers) is used; not bad_command (ebm-bad_command)" in out
        assert "SHADOWED sampler 'mala': samplers (ebm-samplers, first-party) is used; not bad_command (ebm-bad_command)" in out
        assert "CONFLICT" not in out
