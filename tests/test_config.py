"""Configuration files and their precedence; every bad value names the key and the file."""

import pytest

import ebmcore
from ebmcore.config import load_config, load_job_config, parse_device, positive, seed_range
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


_SCHEMA = {"train": {"lr": ((float, positive), 1e-3), "seed": ((int, seed_range), 0), "device": ((str,), "cpu")}}


def test_an_int_is_accepted_where_a_float_is_meant(tmp_path):
    (tmp_path / "lr.toml").write_text("[train]\nlr = 1\n")
    config = load_job_config(tmp_path / "lr.toml", _SCHEMA)
    assert config["train"]["lr"] == 1.0 and isinstance(config["train"]["lr"], float)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[train]\nlr = -1\n", "lr.toml [train]: key 'lr' must be > 0, got -1."),
        ("[train]\nlr = true\n", "lr.toml [train]: key 'lr' must be float, got True."),
        ("[train]\nseed = 18446744073709551616\n", "lr.toml [train]: key 'seed' must be in [0, 2**64)"),
        ("[train]\nseed = -1\n", "lr.toml [train]: key 'seed' must be in [0, 2**64)"),
        ("[train]\nrate = 1\n", "lr.toml [train]: unknown key(s) rate"),
        ("[trian]\n", "lr.toml: unknown key(s) trian"),
    ],
)
def test_errors_name_the_file_and_table_in_one_format(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lr.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_job_config("lr.toml", _SCHEMA)
    assert str(err.value).startswith(message)


def test_a_file_that_is_not_utf8_is_an_error_saying_so(tmp_path):
    (tmp_path / "latin1.toml").write_bytes('[train]\ndevice = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(
        ConfigError, match=r"latin1\.toml: not UTF-8 text \(byte b'\\xe9' at offset 21\).*save it in that encoding"
    ):
        load_job_config(tmp_path / "latin1.toml", _SCHEMA)


def test_the_meta_device_is_refused_up_front():
    with pytest.raises(ConfigError, match="'meta' tensors hold shapes but no values.*use 'cpu' or 'cuda'"):
        parse_device("meta", "run.toml [run] device")
