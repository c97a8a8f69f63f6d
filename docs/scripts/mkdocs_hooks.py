"""MkDocs hooks for the documentation site (mkdocs.yml: ``hooks``).

The library's docstrings use Sphinx roles (``:class:`ebmcore.EnergyModel```), which Markdown renders
as the literal role followed by code. The role is dropped from the rendered page, leaving the code.
"""

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(?=<code>)")


def on_page_content(html, **kwargs):
    return _ROLE.sub("", html)
