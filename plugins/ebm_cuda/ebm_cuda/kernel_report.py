"""What a Triton kernel costs on a GPU, read from its compiled code without a GPU: ``triton.compile`` for
``GPUTarget("cuda", capability, 32)``, then Triton's own ``ptxas -v`` (registers, spills) and ``nvdisasm`` (the machine
code, SASS) of the cubin it builds.

The static cost of a chain kernel is the length of its step loop: the SASS instructions one warp issues per pass,
times the program's warps, over its chains: **warp-instructions per chain-step**. It counts replicated work (warps
that compute the same elements), padding and layout conversions, which ``ptxas`` registers do not show; it does not
count latency, memory stalls or occupancy, so it is a floor on the time, not a timing. It is repeatable to the
instruction, which timings on a shared GPU are not.

:func:`compile_report` and :func:`normals_compile_report` report the kernels of :mod:`ebm_cuda.triton_chains` so
(``benchmarks/triton_static.py``, ``benchmarks/triton_sweep.py`` and the tests); the runtime never imports this module.
Imports triton on first call only."""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from typing import Any, Optional

import torch

from ebm_cuda.activations import decode
from ebm_cuda.triton_contrastive import _partial_size
from ebm_cuda.triton_launch import _kernels, _launch, _pad

__all__ = ["ptxas_report", "step_loop_instructions", "compile_report", "normals_compile_report"]

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


def compile_report(
    capability: int,
    *,
    widths: tuple[int, ...] = (2, 64, 64),
    activations: tuple[int, ...] | None = None,
    block_n: Optional[int] = None,
    precision: str = "ieee",
    dtype: torch.dtype = torch.float32,
    noise_from_tensor: bool = False,
    per_chain: bool = False,
    num_warps: Optional[int] = None,
    contrastive: bool = False,
    has_b: bool = True,
) -> dict[str, Any]:
    """Compile the chain kernel for ``sm_<capability>`` without a GPU (``triton.compile`` for ``GPUTarget("cuda",
    capability, 32)``) and report what :func:`ptxas_report` reads from its ``ptxas -v`` and
    machine code: ``{"registers", "spill_stores", "spill_loads", "stack", "shared", "seconds", "loop_instructions",
    "per_chain_step"}`` (bytes but registers; the step loop's instructions per warp, and warp-instructions per
    chain-step), plus the ``"block_n"`` and ``"num_warps"`` compiled. ``widths``: ``(d, h_1, …)`` before padding;
    ``activations``: codes of :data:`ebm_cuda.activations.ACTIVATION_CODES` per hidden layer (SiLU everywhere by default); ``noise_from_tensor``,
    ``per_chain``: the variants that read the noise from a tensor and the step sizes and noise scales per chain;
    ``contrastive``: the kernel of :func:`ebm_cuda.triton_contrastive.feedforward_contrastive_chain` (``has_b``: with quadratic coefficients ``b``);
    ``block_n``, ``num_warps``: None for the launchers' choice (:func:`ebm_cuda.triton_launch.launch_config`)."""
    fn = _kernels().langevin_kernel
    padded = [_pad(w) for w in widths]
    n_hidden = len(widths) - 1
    acts = [decode(code) for code in (activations if activations is not None else (0,) * n_hidden)]
    block_n, warps = _launch(tuple(padded), precision, contrastive, block_n, num_warps)
    element = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    signature: dict[str, str] = {
        name: "*fp32"
        for name in (
            "noise_ptr",
            "hv_ptr",
            "sv_ptr",
            "w1_ptr",
            "b1_ptr",
            "w2_ptr",
            "b2_ptr",
            "w3_ptr",
            "b3_ptr",
            "wo_ptr",
            "a_ptr",
            "b_ptr",
            "bo_ptr",
            "e_ptr",
            "part_ptr",
        )
    }
    signature.update(
        x_ptr=f"*{element}",
        out_ptr=f"*{element}",
        n="i32",
        d="i32",
        stride_x="i32",
        stride_out="i32",
        n_steps="i32",
        h="fp32",
        s="fp32",
        seed_lo="i32",
        seed_hi="i32",
        offset_lo="i32",
        offset_hi="i32",
    )
    constexprs = dict(
        D0=padded[0],
        DN=_kernels().noise_columns(widths[0], padded[0], block_n),
        H1=padded[1],
        H2=(padded + [16, 16])[2],
        H3=(padded + [16, 16, 16])[3],
        N_HIDDEN=n_hidden,
        ACT1=acts[0][0],
        ACT2=(acts + [(0, 0.0)] * 2)[1][0],
        ACT3=(acts + [(0, 0.0)] * 3)[2][0],
        PARAM1=acts[0][1],
        PARAM2=(acts + [(0, 0.0)] * 2)[1][1],
        PARAM3=(acts + [(0, 0.0)] * 3)[2][1],
        BLOCK_N=block_n,
        NOISE_FROM_TENSOR=noise_from_tensor,
        PER_CHAIN_H=per_chain,
        PER_CHAIN_S=per_chain,
        PRECISION=precision,
        CONTRASTIVE=contrastive,
        HAS_B=contrastive and has_b,
        P=_partial_size(tuple(padded)) if contrastive else 1,
        PTX_MATH=True,
    )
    report = ptxas_report(fn, signature, constexprs, capability, warps, chains_per_program=block_n)
    return dict(report, block_n=block_n, num_warps=warps)


def normals_compile_report(capability: int, *, d: int = 16) -> dict[str, Any]:
    """:func:`compile_report` for the kernel of :func:`ebm_cuda.triton_chains.stream_normals` (``d`` columns, padded as the chain pads them)."""
    fn = _kernels().normals_kernel
    signature = dict(out_ptr="*fp32", n="i32", d="i32", seed_lo="i32", seed_hi="i32", step_lo="i32", step_hi="i32")
    return dict(ptxas_report(fn, signature, dict(D=_pad(d), BLOCK_N=16), capability, 4), block_n=16, num_warps=4)
