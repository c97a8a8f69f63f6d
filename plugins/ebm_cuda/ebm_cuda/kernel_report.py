"""What a Triton kernel costs on a GPU, read from its compiled code without a GPU: ``triton.compile`` for
``GPUTarget("cuda", capability, 32)``, then Triton's own ``ptxas -v`` (registers, spills) and ``nvdisasm`` (the machine
code, SASS) of the cubin it builds.

The static cost of a chain kernel is the length of its step loop: the SASS instructions one warp issues per pass,
times the program's warps, over its chains: **warp-instructions per chain-step**. It counts replicated work (warps
that compute the same elements), padding and layout conversions, which ``ptxas`` registers do not show; it does not
count latency, memory stalls or occupancy, so it is a floor on the time, not a timing. It is repeatable to the
instruction, which timings on a shared GPU are not.

Imports triton on first call only (``triton_chains.compile_report`` calls it)."""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from typing import Any, Optional

__all__ = ["ptxas_report", "step_loop_instructions"]

_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_TARGET = re.compile(r"`\(?(\.L_x_\d+)\)?")


def step_loop_instructions(sass: str) -> Optional[int]:
    """Instructions in the body of the outermost loop of ``sass`` (``nvdisasm`` text of one kernel): the span from the
    loop's first instruction to its backward branch, less every region that a forward branch skips and that holds a
    loop of its own: those are libdevice's slow paths (``sin``/``cos`` of arguments beyond 10⁵, the Payne–Hanek
    reduction, which Box–Muller's angles in [0, 2π) never take). None where the code has no loop. For a kernel with a
    step loop: in one without, the largest loop may be such a slow path. A slow path's region starts after the
    nearest forward branch over its loop, so the few instructions between an earlier skip and it (the
    infinity and NaN cases) are counted: under 1 % of the step loop."""
    labels: dict[str, int] = {}
    branches: list[tuple[int, str]] = []  # (index, target label)
    n = 0
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = n
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            if instruction.group(1).startswith("BRA"):
                target = _TARGET.search(instruction.group(2))
                if target:
                    branches.append((n, target.group(1)))
            n += 1
    loops = [(labels[t], i) for i, t in branches if labels.get(t, n) < i]  # backward branches: (head, back edge)
    if not loops:
        return None
    head, back = max(loops, key=lambda loop: loop[1] - loop[0])
    inner = [(h, b) for h, b in loops if head < h and b < back]
    cold: set[int] = set()  # the slow paths' instructions (their regions may overlap)
    for h, b in inner:
        skips = [(i, labels[t]) for i, t in branches if head <= i < h and b < labels.get(t, -1) <= back]
        if skips:
            start, end = min(skips, key=lambda skip: h - skip[0])  # the nearest forward branch over the inner loop
            cold.update(range(start + 1, end))
    return back - head + 1 - len(cold)


def ptxas_report(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    capability: int,
    warps: int,
    chains_per_program: Optional[int] = None,
) -> dict[str, Any]:
    """Compile the ``@triton.jit`` function ``fn`` for ``sm_<capability>`` with ``warps`` warps, its pointers declared
    16-byte aligned as Triton's launcher declares torch's allocations (without the hint the compiled kernel is another
    one), and report ``{"registers", "spill_stores", "spill_loads", "stack", "shared", "seconds", "loop_instructions",
    "per_chain_step"}``: bytes but registers; for a chain kernel (``chains_per_program`` given: one with a step loop)
    ``loop_instructions``, :func:`step_loop_instructions` of its SASS, and ``per_chain_step``, that times ``warps``
    over ``chains_per_program``; both None for other kernels or without ``nvdisasm``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvidia
    from triton.compiler import ASTSource

    signature = dict(signature, **{name: "constexpr" for name in constexprs})
    signature = {name: signature[name] for name in fn.arg_names}
    start = time.perf_counter()
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if signature[name].startswith("*")}
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()},
        attrs=aligned,
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})
    seconds = time.perf_counter() - start
    ptxas = nvidia.get_ptxas(capability).path
    with tempfile.TemporaryDirectory() as tmp:
        ptx = f"{tmp}/kernel.ptx"
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run(
            [
                ptxas,
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name={nvidia.sm_arch_from_capability(capability)}",
                ptx,
                "-o",
                f"{tmp}/kernel.cubin",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        cubin = f"{tmp}/launched.cubin"
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])  # the code the launcher loads
        loop = _disassembled_loop(cubin) if chains_per_program is not None else None

    def number(pattern: str) -> int:
        match = re.search(pattern, log)
        return int(match.group(1)) if match else 0

    per_chain_step = None if loop is None else loop * warps / chains_per_program
    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "stack": number(r"(\d+) bytes stack frame"),
        "shared": int(compiled.metadata.shared),
        "seconds": seconds,
        "loop_instructions": loop,
        "per_chain_step": per_chain_step,
    }


def _disassembled_loop(cubin: str) -> Optional[int]:
    """:func:`step_loop_instructions` of ``cubin``, by Triton's ``nvdisasm`` (None where Triton finds none)."""
    from triton import knobs

    try:
        nvdisasm = knobs.nvidia.nvdisasm.path
    except RuntimeError:  # "Cannot find nvdisasm"
        return None
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    return step_loop_instructions(sass)
