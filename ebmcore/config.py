"""Configuration: ``ebm.toml`` or ``[tool.ebm]`` in ``pyproject.toml``, and environment variables.

Precedence, strongest first:

1. explicit arguments (``backend=`` on a call);
2. ``ebmcore.use_backend(...)`` context managers;
3. environment variables: ``EBM_BACKEND``, ``EBM_DISABLE_PLUGIN_AUTOLOAD``, ``EBM_DISABLE_PLUGINS``
   (the last adds to the file's ``disable_plugins``: a plugin blocked anywhere stays blocked);
4. the configuration file: ``$EBM_CONFIG`` if set, else ``./ebm.toml``, else the
   ``[tool.ebm]`` table of ``./pyproject.toml`` (the first that exists is used, alone);
5. the defaults below.

Keys (all optional)::

    backend = ["cuda", "torch"]        # kernel backends allowed, in order of preference
    disable_plugin_autoload = false    # true: load no external plugin
    disable_plugins = ["some_plugin"]  # entry-point names not to load
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmcore.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "Config",
    "get_config",
    "load_config",
    "reload_config",
    "generation",
    "parse_backend_list",
    "env_flag",
    "validate_table",
    "read_toml",
    "load_job_config",
    "parse_device",
    "REQUIRED",
    "positive",
    "non_negative",
    "seed_range",
    "max_threads",
    "thread_count",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Config:
    """The resolved core configuration; ``source`` says which file it came from (if any).

    ``backend`` is the file's selection; ``EBM_BACKEND`` is read live by the
    kernel resolver, so that it can be changed while the process runs.
    """

    backend: tuple[str, ...] = ()
    disable_plugin_autoload: bool = False
    disable_plugins: frozenset[str] = frozenset()
    source: str = "defaults"


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable strictly (1/0, true/false, yes/no, on/off)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"environment variable {name}={raw!r} is not a boolean; use 1 or 0.")


def parse_backend_list(value: Any, where: str) -> tuple[str, ...]:
    """A backend selection: ``"torch"``, ``"cuda,torch"`` or ``["cuda", "torch"]`` -> a tuple of names."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise ConfigError(f"{where}: expected a backend name or a list of names, got {value!r}.")
    if not items or any(not v for v in items):
        raise ConfigError(f"{where}: empty backend name in {value!r}; example: \"cuda,torch\".")
    return tuple(items)


def _config_file() -> tuple[Path, dict[str, Any]] | None:
    explicit = os.environ.get("EBM_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"EBM_CONFIG={explicit!r} does not name a file; unset it or point it at an ebm.toml.")
        return path, _read_toml(path)
    local = Path.cwd() / "ebm.toml"
    if local.is_file():
        return local, _read_toml(local)
    pyproject = Path.cwd() / "pyproject.toml"
    if pyproject.is_file():
        table = _read_toml(pyproject).get("tool", {}).get("ebm")
        if table is not None:
            return pyproject, table
    return None


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file; a missing file or bad syntax is a :class:`ConfigError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such configuration file.")
    return _read_toml(path)


def validate_table(table: Any, schema: dict[str, Any], where: str, _tables: tuple[str, ...] = ()) -> dict[str, Any]:
    r"""Check ``table`` against ``schema`` and return it with defaults filled in.

    ``schema`` maps each key to ``(types, default)`` -- ``default`` is ``REQUIRED`` for a required
    key -- or to a nested schema (a dict) for a sub-table. ``types`` may include a callable check
    ``lambda value: error_or_None``. An int is accepted (as a float) where ``float`` is. Unknown keys
    and wrong types are :class:`ConfigError`\ s that name ``where`` (the file) and the table and key,
    as ``file [table]: key 'k' ...``.
    """
    here = f"{where} [{'.'.join(_tables)}]" if _tables else where
    if not isinstance(table, dict):
        raise ConfigError(f"{here}: expected a table, got {table!r}.")
    unknown = sorted(set(table) - set(schema))
    if unknown:
        raise ConfigError(f"{here}: unknown key(s) {', '.join(unknown)}; the known keys are {', '.join(sorted(schema))}.")
    out: dict[str, Any] = {}
    for key, rule in schema.items():
        if isinstance(rule, dict):
            out[key] = validate_table(table.get(key, {}), rule, where, (*_tables, key))
            continue
        types, default = rule
        if key not in table:
            if default is REQUIRED:
                raise ConfigError(f"{here}: key '{key}' is required.")
            out[key] = default
            continue
        given = value = table[key]
        checks = [t for t in types if not isinstance(t, type)]
        kinds = tuple(t for t in types if isinstance(t, type))
        if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # lr = 1 means 1.0
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{here}: key '{key}' must be {names}, got {given!r}.")
        for check in checks:
            problem = check(value)
            if problem:
                raise ConfigError(f"{here}: key '{key}' {problem}, got {given!r}.")
        out[key] = value
    return out


def load_job_config(
    path: str | os.PathLike, schema: dict[str, Any], overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Read a job configuration (``ebm train``, ``ebm sample``), apply command-line ``overrides``
    (``{"table": {"key": value}}``, ``None`` values ignored), validate it against ``schema``, and
    record the file in ``config["source"]``."""
    table = read_toml(path)
    for section, values in (overrides or {}).items():
        table.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    config = validate_table(table, schema, str(path))
    config["source"] = str(path)
    return config


def parse_device(value: str, where: str) -> Any:
    """A ``torch.device`` that this machine can use, or a :class:`ConfigError` naming ``where``."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{where}: {value!r} is not a device ({exc}); use e.g. 'cpu' or 'cuda:0'.") from None
    if device.type == "meta":
        raise ConfigError(
            f"{where}: 'meta' tensors hold shapes but no values, so a run cannot sample or train on them; use 'cpu' or 'cuda'."
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{where}: device {value!r} is not available (no CUDA device, or a CPU-only torch); use 'cpu'.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{where}: device {value!r} does not exist; this machine has {torch.cuda.device_count()} CUDA device(s)."
            )
    return device


def positive(value: Any) -> str | None:
    """A :func:`validate_table` check: the value must be > 0."""
    return None if value > 0 else "must be > 0"


def non_negative(value: Any) -> str | None:
    """A :func:`validate_table` check: the value must be >= 0."""
    return None if value >= 0 else "must be >= 0"


def max_threads() -> int:
    """The most torch threads a job may ask for: 4 × ``os.cpu_count()`` (at least 4). Far more crashes torch: 100000
    threads ended ``ebm train`` with SIGSEGV (issue 40)."""
    return 4 * (os.cpu_count() or 1)


def thread_count(value: Any) -> str | None:
    """A :func:`validate_table` check: a torch thread count, 0 (the free cores) to :func:`max_threads`."""
    if value < 0:
        return "must be >= 0 (0: the cores no other process keeps busy)"
    limit = max_threads()
    return (
        None
        if value <= limit
        else (
            f"must be at most {limit} (4 × the {limit // 4} cores of this machine); "
            "give 1 (the default) or 0 for the cores no other process keeps busy"
        )
    )


def seed_range(value: Any) -> str | None:
    """A :func:`validate_table` check: a seed of a ``torch.Generator``, in ``[0, 2**64)``."""
    return None if 0 <= value < 2**64 else "must be in [0, 2**64) (a torch.Generator seed)"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML ({exc}); fix the syntax or remove the file.") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset {exc.start}); "
            "TOML files are UTF-8: save it in that encoding."
        ) from None


_KEYS = {"backend", "disable_plugin_autoload", "disable_plugins"}


def _from_table(table: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; the known keys are {', '.join(sorted(_KEYS))}.")
    out: dict[str, Any] = {}
    if "backend" in table:
        out["backend"] = parse_backend_list(table["backend"], f"{where}: key 'backend'")
    if "disable_plugin_autoload" in table:
        value = table["disable_plugin_autoload"]
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: key 'disable_plugin_autoload' must be true or false, got {value!r}.")
        out["disable_plugin_autoload"] = value
    if "disable_plugins" in table:
        value = table["disable_plugins"]
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: key 'disable_plugins' must be a list of plugin names, got {value!r}.")
        out["disable_plugins"] = frozenset(value)
    return out


def load_config() -> Config:
    """Read the configuration file and environment now (see the module docstring for precedence)."""
    values: dict[str, Any] = {}
    source = "defaults"
    found = _config_file()
    if found is not None:
        path, table = found
        where = f"{path} [tool.ebm]" if path.name == "pyproject.toml" else str(path)
        values.update(_from_table(table, where))
        source = where
    if "EBM_DISABLE_PLUGIN_AUTOLOAD" in os.environ:
        values["disable_plugin_autoload"] = env_flag("EBM_DISABLE_PLUGIN_AUTOLOAD")
    if os.environ.get("EBM_DISABLE_PLUGINS", "").strip():
        blocked = {v.strip() for v in os.environ["EBM_DISABLE_PLUGINS"].split(",") if v.strip()}
        values["disable_plugins"] = frozenset(blocked) | values.get("disable_plugins", frozenset())
    return Config(source=source, **values)


_config: Config | None = None
_generation = 0


def get_config() -> Config:
    """The configuration, read once and cached; :func:`reload_config` reads it again."""
    global _config
    if _config is None:
        _config = load_config()
    return _config


def reload_config() -> Config:
    """Read the configuration again; the plugins (and their kernel choices) are loaded again with it
    at the next lookup."""
    global _config, _generation
    _config = load_config()
    _generation += 1
    return _config


def generation() -> int:
    """How many times :func:`reload_config` has run: the plugin session reloads when it changes."""
    return _generation
