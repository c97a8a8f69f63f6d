"""Library messages go through :mod:`logging`, one logger per package, named after it (``ebmcore``,
``ebm_samplers``, ``ebm_losses``, ``ebm_cuda``, and a third-party plugin's own): ``logging.getLogger(__name__)``.

A library leaves its loggers unconfigured (Python then shows warnings and errors only); the ``ebm`` command
calls :func:`configure`, which sends the messages of ebm's packages at ``level`` and above to stderr:
INFO by default, WARNING with ``--quiet``, DEBUG with ``--verbose``. ``warnings.warn`` is kept for what the
user must act on (chains that became non-finite).
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from typing import Any

__all__ = ["configure", "package_loggers"]


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the ``sys.stderr`` of the moment, so that a redirected or captured stderr gets the messages."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _Format(logging.Formatter):
    """``message`` for information, ``warning: message`` (``error: ...``) for what needs attention."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def package_loggers() -> list[str]:
    """``ebmcore`` and the top-level package of every plugin entry point (group ``ebmcore``)."""
    names = ["ebmcore"]
    for ep in importlib.metadata.entry_points(group="ebmcore"):
        package = ep.value.split(":")[0].split(".")[0].strip()
        if package not in names:
            names.append(package)
    return names


def configure(level: int = logging.INFO) -> None:
    """Show the messages of :func:`package_loggers` at ``level`` and above on stderr (idempotent)."""
    handler = _Stderr()
    handler.setFormatter(_Format("%(message)s"))
    for name in package_loggers():
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _Stderr)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
