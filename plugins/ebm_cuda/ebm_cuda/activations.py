"""The activations the native network kernels run (the host build's feed-forward and conv kernels, and the Triton
chains), and their codes: the one table of them.

The list is written once, in the ``EBM_ACTIVATIONS`` X-macro of ``csrc/ebm/feedforward_host.h`` (shipped with the
package; the C kernels switch on it), each entry named by its :class:`ebmcore.energies.program.ActivationKind`; it is
read here at import into :data:`ACTIVATION_CODES`, and the Triton kernels branch on the same codes
(``_triton_kernels._activation``). Adding an activation is its line in the X-macro with its C case, and its Triton
branch: two files.

An activation's code (:func:`activation_code`) is an int64 that carries the kind's parameter where it has one: the
kind's code in the low 32 bits, the parameter's float32 bits (as a signed word) in the high 32 (leaky ReLU's
``negative_slope``, ELU's ``alpha``; :func:`decode` reads it back). A kind with more than one parameter (softplus:
``beta`` and ``threshold``) is not in the table.
"""

from __future__ import annotations

import re
import struct
from typing import Iterable, Optional

from ebmcore.energies.program import Activation, ActivationKind
from ebm_cuda.build import CSRC

__all__ = ["HEADER", "ACTIVATION_CODES", "read_activations", "activation_code", "activation_refusal", "decode"]

HEADER = CSRC / "ebm" / "feedforward_host.h"
"""The header that lists the kernels' activations (``EBM_ACTIVATIONS``)."""

_ENTRY = re.compile(r"X\(\s*([A-Z][A-Z0-9_]*)\s*,\s*(\d+)\s*\)")


def read_activations(text: str) -> dict[ActivationKind, int]:
    """``kind -> code`` from the ``#define EBM_ACTIVATIONS(X)`` lines of a header's ``text``; codes must be
    0, 1, ... in order (the C side checks a code against their count), and each kind takes at most one parameter."""
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
            if len(ActivationKind[name].param_names) > 1:
                raise RuntimeError(
                    f"{HEADER.name}:{i + 1}: {name} has parameters {ActivationKind[name].param_names}; a code carries one"
                )
            codes[ActivationKind[name]] = int(code)
    return codes


ACTIVATION_CODES: dict[ActivationKind, int] = read_activations(HEADER.read_text())
"""``kind -> code`` of the activations the kernels run (``EBM_ACTIVATIONS`` in ``csrc/ebm/feedforward_host.h``)."""


def activation_code(activation: Activation) -> int:
    """The int64 code of ``activation``, its parameter (if its kind has one) in the high word (check
    :func:`activation_refusal` first)."""
    code = ACTIVATION_CODES[activation.kind]
    if not activation.params:
        return code
    (bits,) = struct.unpack("<i", struct.pack("<f", activation.params[0]))
    return (bits << 32) | code


def decode(code: int) -> tuple[int, float]:
    """``(kind code, parameter as float32)`` of an :func:`activation_code` (parameter 0.0 for a kind without one)."""
    (param,) = struct.unpack("<f", struct.pack("<i", code >> 32))
    return code & 0xFFFFFFFF, param


def activation_refusal(activations: Iterable[Activation]) -> Optional[str]:
    """Why the kernels cannot run these activations (None: they can)."""
    missing = sorted({str(a) for a in activations if a.kind not in ACTIVATION_CODES})
    if missing:
        return f"has no {', '.join(missing)} (it takes {', '.join(k.value for k in ACTIVATION_CODES)})"
    return None
