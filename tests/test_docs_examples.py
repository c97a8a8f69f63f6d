"""Every Python example in docs/ runs (an example that breaks fails CI).

Each ```python block is executed on its own, in a fresh namespace, from an empty working
directory, with a clean environment and plugin session. A block preceded by the line
``<!-- no-test -->`` is a fragment or needs an installed third-party package, and is skipped.
"""

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"(<!-- no-test -->\n)?```python\n(.*?)```", re.S)


def _examples():
    for page in sorted(DOCS.glob("*.md")):
        for i, match in enumerate(_BLOCK.finditer(page.read_text())):
            marks = [pytest.mark.skip(reason="marked <!-- no-test -->")] if match.group(1) else []
            yield pytest.param(page.name, match.group(2), id=f"{page.stem}-{i}", marks=marks)


def test_the_docs_have_examples():
    assert sum(1 for _ in _examples()) > 40


@pytest.mark.parametrize("page, code", list(_examples()))
def test_docs_example_runs(page, code):
    saved = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"docs/{page}", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        assert exc.code in (0, None), f"docs/{page}: example exited with {exc.code}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
