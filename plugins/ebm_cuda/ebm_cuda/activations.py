"""The activations the feed-forward and conv kernels run, and their codes in the C API.

The list is written once, in the ``EBM_ACTIVATIONS`` X-macro of ``csrc/ebm/feedforward_host.h`` (shipped with the
package), each entry named by its :class:`ebmcore.energies.program.ActivationKind`; it is read here at import into
:data:`ACTIVATION_CODES`. The kernels take the activations without parameters (an activation whose kind carries
parameters would need them passed: none of those is native yet).
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from ebmcore.energies.program import Activation, ActivationKind
from ebm_cuda.build import CSRC

__all__ = ["HEADER", "ACTIVATION_CODES", "read_activations", "activation_code", "activation_refusal"]

HEADER = CSRC / "ebm" / "feedforward_host.h"
"""The header that lists the kernels' activations (``EBM_ACTIVATIONS``)."""

_ENTRY = re.compile(r"X\(\s*([A-Z][A-Z0-9_]*)\s*,\s*(\d+)\s*\)")


def read_activations(text: str) -> dict[ActivationKind, int]:
    """``kind -> code`` from the ``#define EBM_ACTIVATIONS(X)`` lines of a header's ``text``; codes must be
    0, 1, ... in order (the C side checks a code against their count)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#define EBM_ACTIVATIONS(X)")), None)
    if start is None:
        raise RuntimeError(f"{HEADER.name}: no '#define EBM_ACTIVATIONS(X)' (the list of the kernels' activations)")
    codes: dict[ActivationKind, int] = {}
    i = start
    while lines[i].rstrip().endswith("\\"):
        i += 1
        for name, code in _ENTRY.findall(lines[i]):
            if name not in ActivationKind.__members__:
                raise RuntimeError(
                    f"{HEADER.name}:{i + 1}: {name} is not an ebmcore ActivationKind ({', '.join(ActivationKind.__members__)})"
                )
            if int(code) != len(codes):
                raise RuntimeError(f"{HEADER.name}:{i + 1}: activation codes must be 0, 1, ... in order; {name} has {code}")
            codes[ActivationKind[name]] = int(code)
    return codes


ACTIVATION_CODES: dict[ActivationKind, int] = read_activations(HEADER.read_text())
"""``kind -> code`` of the activations the kernels run (``EBM_ACTIVATIONS`` in ``csrc/ebm/feedforward_host.h``)."""


def activation_code(activation: Activation) -> int:
    """The C code of ``activation`` (check :func:`activation_refusal` first)."""
    return ACTIVATION_CODES[activation.kind]


def activation_refusal(activations: Iterable[Activation]) -> Optional[str]:
    """Why the kernels cannot run these activations (None: they can)."""
    missing = sorted({str(a) for a in activations if a.kind not in ACTIVATION_CODES or a.params})
    if missing:
        return f"has no {', '.join(missing)} (it takes {', '.join(k.value for k in ACTIVATION_CODES)})"
    return None
