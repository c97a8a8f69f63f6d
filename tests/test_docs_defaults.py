"""docs/cli.md's tables of the job configurations hold the code's defaults: each row's `default` is the SCHEMA's
(``ebm_samplers.sample_job.SCHEMA``, ``ebm_losses.train_job.SCHEMA``) and its `bundled` the bundled file's value
(the file's, else the default; `—`: not shown); every row names a key of the SCHEMA (issue 40: `[sampler] n_steps`
said 500 where the code's default is 1000)."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "cli.md").read_text()


def _rows(section: str) -> dict[str, dict[str, tuple[str, str]]]:
    """``{table: {key: (default, bundled)}}`` of the tables under ``## <section>``, cells as written."""
    text = PAGE.split(f"\n## {section}\n")[1].split("\n## ")[0]
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for table, body in re.findall(r"^### `\[(\w+)\]`\n(.*?)(?=^### |\Z)", text, re.M | re.S):
        for line in body.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cells) == 6 and re.fullmatch(r"`\w+`", cells[0]):
                tables.setdefault(table, {})[cells[0].strip("`")] = (cells[2], cells[3])
    return tables


def _value(cell: str):
    assert cell.startswith("`") and cell.endswith("`"), cell
    return tomllib.loads(f"v = {cell[1:-1]}")["v"]


def _jobs():
    from ebm_losses import train_job
    from ebm_samplers import sample_job

    samplers = Path(sample_job.__file__).parent / "configs" / "sample_default.toml"
    return [
        pytest.param("Sample configuration", sample_job.SCHEMA, samplers, id="sample"),
        pytest.param("Train configuration", train_job.SCHEMA, train_job.default_config_path(), id="train"),
    ]


@pytest.mark.parametrize("section, schema, bundled_file", _jobs())
def test_the_documented_defaults_are_the_code_s(section, schema, bundled_file):
    rows = _rows(section)
    bundled = tomllib.loads(bundled_file.read_text())
    assert set(rows) == set(schema), f"docs/cli.md {section}: tables {sorted(rows)}, the SCHEMA's {sorted(schema)}"
    compared = 0
    for table, keys in rows.items():
        for key, (shown, shown_bundled) in keys.items():
            assert key in schema[table], f"docs/cli.md {section} [{table}] {key}: not a key of the SCHEMA"
            default = schema[table][key][1]
            assert _value(shown) == default, f"docs/cli.md {section} [{table}] {key}: default {shown}, code {default!r}"
            if shown_bundled != "—":
                value = bundled.get(table, {}).get(key, default)
                assert _value(shown_bundled) == value, (
                    f"docs/cli.md {section} [{table}] {key}: bundled {shown_bundled}, {bundled_file.name} {value!r}"
                )
            compared += 1
    assert compared >= 20
