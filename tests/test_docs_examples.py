"""Every Python example in docs/ runs (an example that breaks fails CI).

Every page under docs/, subfolders included, is read. Each ```python block is executed on its own,
in a fresh namespace, from an empty working directory, with a clean environment and plugin session.
A block preceded by the line ``<!-- no-test -->`` is a fragment, and is skipped. A block preceded by
``<!-- installed: ebm-example-plugin -->`` needs the example plugin of docs/plugins.md installed:
``test_the_plugin_walkthrough`` installs the real package (tests/fixtures/ebm_example_plugin) and
runs those blocks against it, after checking that the page shows the package's own files.
"""

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FIXTURE = ROOT / "tests" / "fixtures" / "ebm_example_plugin"
INSTALLED = "installed: ebm-example-plugin"
_BLOCK = re.compile(
    r"(?:<!-- (no-test|installed: ebm-example-plugin|output: not checked) -->\n)?```python\n(.*?)```"
    r"(?:\n\n```\n(.*?)```)?",
    re.S,
)  # a block, and the output it shows (a fence with no language)
_FENCE = re.compile(r"```(\w*)\n(.*?)```(?:\n\n```\n(.*?)```)?", re.S)  # a block and the output block after it


def _examples():
    for page in sorted(DOCS.rglob("*.md")):
        name = page.relative_to(DOCS).as_posix()
        for i, match in enumerate(_BLOCK.finditer(page.read_text())):
            marks = []
            if match.group(1) == "no-test":
                marks = [pytest.mark.skip(reason="marked <!-- no-test -->")]
            elif match.group(1) == INSTALLED:
                marks = [pytest.mark.skip(reason="needs the example plugin: run by test_the_plugin_walkthrough")]
            shown = None if match.group(1) == "output: not checked" else match.group(3)
            yield pytest.param(name, match.group(2), shown, id=f"{name.removesuffix('.md')}-{i}", marks=marks)


def test_the_docs_have_examples():
    assert sum(1 for _ in _examples()) > 40


def _matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is the ``shown`` output: line by line, trailing spaces aside; where the output depends on
    the machine (timings, a temporary path, a GPU), a shown line ``...`` stands for any lines, and ``...`` within a
    line for any text."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip("\n").split("\n")]

    pattern = "\n".join(
        "(?:.*\n)*?.*" if line == "..." else re.escape(line).replace(re.escape("..."), ".*") for line in lines(shown)
    )
    return re.fullmatch(pattern, "\n".join(lines(printed))) is not None


@pytest.mark.parametrize("page, code, shown", list(_examples()))
def test_docs_example_runs(page, code, shown):
    """The example runs, and prints what the page shows after it (an output block right after the code, unless
    marked ``<!-- output: not checked -->``)."""
    # The examples are small; on one thread they cannot be slowed down by oversubscription when
    # another process keeps a core busy (with 2 threads a 200-step training example took 143 s
    # instead of 2 s on the 2-core development machine during a compile).
    saved, threads = dict(os.environ), torch.get_num_threads()
    torch.set_num_threads(1)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"docs/{page}", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        assert exc.code in (0, None), f"docs/{page}: example exited with {exc.code}"
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(saved)
    if shown is not None:
        assert _matches(shown, printed.getvalue()), (
            f"docs/{page}: the example prints\n{printed.getvalue()}\nbut the page shows\n{shown}\n(update the page, "
            "put a line '...' where the output depends on the machine, or mark the block <!-- output: not checked -->)"
        )


def test_the_plugin_walkthrough(tmp_path):
    """docs/plugins.md shows the fixture's own files (pyproject.toml, plugin.py, configs/*.toml), and its tests and
    usage example pass installed."""
    page = (DOCS / "plugins.md").read_text()
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(page)]
    assert ("toml", (FIXTURE / "pyproject.toml").read_text()) in blocks, (
        "docs/plugins.md: the pyproject.toml of the walk-through differs from tests/fixtures/ebm_example_plugin's"
    )
    assert ("python", (FIXTURE / "ebm_example_plugin" / "plugin.py").read_text()) in blocks, (
        "docs/plugins.md: plugin.py of the walk-through differs from tests/fixtures/ebm_example_plugin's"
    )
    for name in ("sample.toml", "train.toml"):  # the configurations tests/test_third_party_plugin.py runs
        assert ("toml", (FIXTURE / "configs" / name).read_text()) in blocks, (
            f"docs/plugins.md: configs/{name} of the walk-through differs from tests/fixtures/ebm_example_plugin's"
        )

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(FIXTURE),
        ],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBM_")}
    env["PYTHONPATH"] = str(site)
    installed = [m for m in _FENCE.finditer(page) if page[: m.start()].endswith(f"<!-- {INSTALLED} -->\n")]
    assert len(installed) == 2, "expected the usage example and tests/test_plugin.py"

    usage, tests = (installed[0], installed[1]) if "def test_" in installed[1].group(2) else (installed[1], installed[0])
    proc = subprocess.run([sys.executable, "-c", usage.group(2)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"docs/plugins.md usage example failed:\n{proc.stderr}"
    assert proc.stdout == usage.group(3), f"docs/plugins.md: the usage example printed\n{proc.stdout}"

    project = tmp_path / "project" / "tests"
    project.mkdir(parents=True)
    conftest = next(code for lang, code in blocks if lang == "python" and code.startswith("# tests/conftest.py"))
    (project / "conftest.py").write_text(conftest)
    (project / "test_plugin.py").write_text(tests.group(2))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"docs/plugins.md: the example plugin's tests failed:\n{proc.stdout[-4000:]}"
    assert "5 passed" in proc.stdout, proc.stdout


def _transcripts(command: str) -> list[tuple[str, str]]:
    """``(page, output)`` of every shell transcript line ``$ <command>`` in docs/: the lines after it, up to the next
    ``$ `` line or the end of the block."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        fences = re.split(r"^```(\w*)\n", page.read_text(), flags=re.M)  # text, language, body, language, ...
        # the fences open and close blocks in turn: the body after an opening fence is the block's
        blocks = [body for language, body in zip(fences[1::4], fences[2::4]) if language == ""]
        for block in blocks:
            parts = re.split(r"^\$ (.*)\n", block, flags=re.M)
            for ran, output in zip(parts[1::2], parts[2::2]):
                if ran == command:
                    found.append((page.relative_to(DOCS).as_posix(), output))
    return found


def test_shown_help_is_what_ebm_prints(capsys, monkeypatch):
    from ebmcore.cli import main

    monkeypatch.setenv("COLUMNS", "100")  # as docs/cli.md says the help was printed
    shown = _transcripts("ebm sample --help")
    assert shown, "docs/cli.md shows `ebm sample --help`"
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    printed = capsys.readouterr().out
    for page, output in shown:
        assert _matches(output, printed), f"docs/{page}: `ebm sample --help` prints\n{printed}\nnot what the page shows"


FIRST_PARTY = ("builtin", "samplers", "losses", "cuda")


def test_shown_plugin_lists_are_what_ebm_plugins_prints(capsys):
    # the lines of the plugins every checkout installs; a transcript may show third-party ones besides
    from ebmcore.cli import main

    assert main(["plugins"]) == 0
    printed = {line.split()[0]: line.rstrip() for line in capsys.readouterr().out.splitlines() if line.split()}
    shown = _transcripts("ebm plugins")
    assert len(shown) >= 3
    compared = 0
    for page, output in shown:
        for line in output.splitlines():
            if line.split() and line.split()[0] in FIRST_PARTY:
                compared += 1
                assert line.rstrip() == printed[line.split()[0]], (
                    f"docs/{page}: `ebm plugins` prints\n{printed[line.split()[0]]}\nwhere the page shows\n{line}"
                )
    assert compared >= 8
