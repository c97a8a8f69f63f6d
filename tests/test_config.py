"""Configuration files and their precedence; every bad value names the key and the file."""

import pytest

import ebmcore
from ebmcore.config import load_config
from ebmcore.errors import ConfigError


def test_defaults_without_a_file():
    config = load_config()
    assert config.source == "defaults" and config.backend == () and not config.disable_plugin_autoload


def test_ebm_toml_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ebm.toml").write_text('backend = "cuda, torch"\ndisable_plugins = ["x"]\n')
    config = load_config()
    assert config.backend == ("cuda", "torch") and config.disable_plugins == {"x"}
    assert config.source.endswith("ebm.toml")


def test_pyproject_tool_table_and_ebm_toml_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.ebm]\nbackend = ["torch"]\n')
    assert load_config().backend == ("torch",) and "[tool.ebm]" in load_config().source
    (tmp_path / "ebm.toml").write_text('backend = ["other"]\n')
    assert load_config().backend == ("other",)  # ebm.toml comes first


def test_ebm_config_variable_points_at_a_file(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.toml"
    path.write_text("disable_plugin_autoload = true\n")
    monkeypatch.setenv("EBM_CONFIG", str(path))
    assert load_config().disable_plugin_autoload is True
    monkeypatch.setenv("EBM_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="does not name a file"):
        load_config()


def test_environment_beats_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ebm.toml").write_text("disable_plugin_autoload = false\n")
    monkeypatch.setenv("EBM_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert load_config().disable_plugin_autoload is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("backnd = 'torch'\n", "unknown key(s) backnd"),
        ("backend = 3\n", "key 'backend': expected a backend name or a list"),
        ("backend = ['cuda', '']\n", "empty backend name"),
        ("disable_plugin_autoload = 'yes'\n", "key 'disable_plugin_autoload' must be true or false"),
        ("disable_plugins = 'a'\n", "key 'disable_plugins' must be a list"),
        ("[plugins.ebm_cuda]\nbuild_dir = 'b'\n", "unknown key(s) plugins"),
        ("backend = [\n", "malformed TOML"),
    ],
)
def test_bad_files_name_the_key_and_the_file(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ebm.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        ebmcore.reload_config()
    assert message in str(err.value) and "ebm.toml" in str(err.value)
