"""The Triton chains' launch configurations, costed without a GPU: each kernel compiled for sm_80 and sm_90 and its
step loop counted in machine code (``ebm_cuda.kernel_report``: warp-instructions per chain-step, registers, spills).

This is how ``ebm_cuda.triton_chains.static_launch_config`` was chosen (``launch_config`` takes it wherever no
recorded device sweep measured the network: ``ebm_cuda.triton_launch.MEASURED_LAUNCH``): per kernel (the Langevin chain, the contrastive
chain) and products (IEEE, TF32, bfloat16), the chains per program (``block_n``) and warps with the fewest
instructions per chain-step that spill at most :data:`SPILL_ALLOWANCE` bytes, over :data:`NETWORKS`; the summary
ends with its choice against the least per network. A count of instructions is a floor on a kernel's time, not a
timing: group T of ``gpu.py`` times the configurations on a GPU.

    python benchmarks/triton_static.py --capabilities 90 --json benchmarks/results/2026-11-26-triton-static.json

writes every row (one compile each: 576 for sm_90, about 25 minutes on 2 cores), then prints the summary tables.
``--networks``, ``--configs``, ``--capabilities``, ``--kernels``, ``--precisions`` narrow the grid; ``--summary FILE``
prints the summary of a file written before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Iterable

NETWORKS = ["2-32", "2-64-64", "2-64-64-64", "16-64-64", "3-40-17-5", "64-64", "64-64-64", "64-64-64-64"]
"""``d-h_1-…`` (the scalar output layer implied), from one hidden layer of 32 to three of 64 on a 64-wide state, and a
ragged one (3-40-17-5, padded to 16-64-32-16: the tests' network); W4 and W5 run 2-64-64."""

CONFIGS = [(block_n, warps) for block_n in (16, 32, 64, 128) for warps in (4, 8, 16)]
"""``(block_n, num_warps)``: 16 to 128 chains per program on 4, 8 or 16 warps."""

KERNELS = ("chain", "contrastive")
PRECISIONS = ("ieee", "tf32x3", "tf32", "bf16")
CAPABILITIES = (80, 90)

SPILL_ALLOWANCE = 64
"""Bytes of spill stores a configuration may have and still count as the least (``ptxas`` spills a word or two where
it aims at occupancy, 8 bytes for the bfloat16 chain of 2-32-1 at 32 × 4 on sm_90: a few local accesses, which the
count holds); where every configuration of a network spills more, the fewest any spills. One choice spills more
(the TF32 chain of 2-64-64-64-1 on sm_90: 72 bytes at 64 chains on 4 warps, where the least that spills 64 or
fewer, 32 on 4, issues 2.6 times the instructions): its ratio to that least is below 1."""


def _widths(network: str) -> tuple[int, ...]:
    """``"d-h_1-…"`` as ``(d, h_1, …)``."""
    return tuple(int(w) for w in network.split("-"))


def row(kernel: str, precision: str, network: str, capability: int, block_n: int, warps: int) -> dict[str, Any]:
    """One compile: the configuration and its :func:`ebm_cuda.kernel_report.compile_report` (or the error)."""
    from ebm_cuda import kernel_report

    widths = _widths(network)
    out: dict[str, Any] = dict(
        kernel=kernel, precision=precision, network=network, capability=capability, block_n=block_n, warps=warps
    )
    try:
        report = kernel_report.compile_report(
            capability, widths=widths, block_n=block_n, precision=precision, num_warps=warps, contrastive=kernel == "contrastive"
        )
    except Exception as error:  # noqa: BLE001 - a configuration that does not compile is a row that says why
        out["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        return out
    out.update(
        {k: report[k] for k in ("registers", "spill_stores", "spill_loads", "shared", "loop_instructions", "per_chain_step")}
    )
    return out


def chosen_against_least(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel, products, network and capability of ``rows``: ``launch_config``'s configuration against the least
    cost among those spilling at most ``allowance`` bytes (:data:`SPILL_ALLOWANCE`, or the fewest of any
    configuration where all spill more): ``{"kernel", "precision", "network", "capability", "chosen", "cost",
    "spill_stores", "allowance", "least", "least_config", "ratio"}`` (None where the chosen configuration is not among
    the rows)."""
    from ebm_cuda import triton_chains

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["precision"], r["network"], r["capability"]), []).append(r)
    out = []
    for (kernel, precision, network, capability), members in groups.items():
        padded = tuple(triton_chains._pad(w) for w in _widths(network))
        chosen = triton_chains.static_launch_config(padded, precision, kernel == "contrastive")
        compiled = [r for r in members if r.get("per_chain_step") is not None]
        allowance = max(SPILL_ALLOWANCE, min((r["spill_stores"] for r in compiled), default=0))
        fit = [r for r in compiled if r["spill_stores"] <= allowance]
        least = min(fit, key=lambda r: r["per_chain_step"], default=None)
        mine = next((r for r in members if (r["block_n"], r["warps"]) == chosen and r.get("per_chain_step")), None)
        out.append(
            dict(
                kernel=kernel,
                precision=precision,
                network=network,
                capability=capability,
                chosen=chosen,
                cost=mine and mine["per_chain_step"],
                spill_stores=mine and mine["spill_stores"],
                allowance=allowance,
                least=least and least["per_chain_step"],
                least_config=least and (least["block_n"], least["warps"]),
                ratio=mine and least and mine["per_chain_step"] / least["per_chain_step"],
            )
        )
    return out


def configuration_before(padded: tuple[int, ...], precision: str, contrastive: bool) -> tuple[int, int]:
    """The configuration before ``launch_config`` (until 2026-11-26): 16 chains per program; 8 warps with TF32 or
    bfloat16 products, 16 with IEEE ones (8 for the contrastive kernel on a state narrower than 64 columns)."""
    if precision != "ieee":
        return 16, 8
    return 16, 16 if not contrastive or padded[0] >= 64 else 8


def launch_table(rows: list[dict[str, Any]], network: str = "2-64-64", capability: int = 90) -> str:
    """The Markdown table of ``docs/cuda.md``: for ``network`` on ``sm_<capability>``, per kernel and products,
    ``launch_config``'s configuration and cost, the configuration before (:func:`configuration_before`) and its cost,
    and the least cost among those spilling at most :data:`SPILL_ALLOWANCE` bytes (:func:`chosen_against_least`)."""
    from ebm_cuda import triton_chains

    padded = tuple(triton_chains._pad(w) for w in _widths(network))
    names = {"ieee": "IEEE", "tf32x3": "split TF32", "tf32": "TF32", "bf16": "bfloat16"}
    lines = [
        "| kernel | products | chosen | its cost | before | its cost | least (configuration) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in chosen_against_least(rows):
        if (c["network"], c["capability"]) != (network, capability):
            continue
        before = configuration_before(padded, c["precision"], c["kernel"] == "contrastive")
        old = next(
            (
                r
                for r in rows
                if (r["kernel"], r["precision"], r["network"], r["capability"])
                == (c["kernel"], c["precision"], network, capability)
                and (r["block_n"], r["warps"]) == before
                and r.get("per_chain_step") is not None
            ),
            None,
        )

        def cost(value: Any) -> str:
            return "not compiled" if value is None else f"{value:.0f}"

        least = "" if c["least"] is None else f"{c['least']:.0f} ({c['least_config'][0]} × {c['least_config'][1]})"
        lines.append(
            f"| {c['kernel']} | {names[c['precision']]} | {c['chosen'][0]} × {c['chosen'][1]} | {cost(c['cost'])} | "
            f"{before[0]} × {before[1]} | {cost(old and old['per_chain_step'])} | {least} |"
        )
    return "\n".join(
        lines[:2]
        + sorted(lines[2:], key=lambda line: (line.split("|")[1], list(names.values()).index(line.split("|")[2].strip())))
    )


def summary(rows: list[dict[str, Any]]) -> str:
    """:func:`launch_table`, then a Markdown table per (kernel, precision): networks × configurations, sm_90 / sm_80
    cost (warp-instructions per chain-step; ``s``: spills beyond :data:`SPILL_ALLOWANCE`, ``x``: did not compile),
    then :func:`chosen_against_least`."""
    lines = []
    if any((r["network"], r["capability"]) == ("2-64-64", 90) for r in rows):
        lines += ["### W4's and W5's network, 2-64-64-1, sm_90 (warp-instructions per chain-step)", "", launch_table(rows), ""]
    configs = sorted({(r["block_n"], r["warps"]) for r in rows})
    for kernel in KERNELS:
        for precision in PRECISIONS:
            members = [r for r in rows if r["kernel"] == kernel and r["precision"] == precision]
            if not members:
                continue
            lines += [
                f"### {kernel}, {precision} products (warp-instructions per chain-step, sm_90 / sm_80)",
                "",
                "| network | " + " | ".join(f"{b}×{w}" for b, w in configs) + " |",
                "|---|" + "---|" * len(configs),
            ]
            for network in NETWORKS:
                cells = []
                for b, w in configs:
                    cell = []
                    for capability in (90, 80):
                        r = next(
                            (
                                r
                                for r in members
                                if r["network"] == network
                                and r["capability"] == capability
                                and (r["block_n"], r["warps"]) == (b, w)
                            ),
                            None,
                        )
                        if r is None:
                            continue
                        if "error" in r or r.get("per_chain_step") is None:
                            cell.append("x")
                        else:
                            cell.append(f"{r['per_chain_step']:.0f}" + ("s" if r["spill_stores"] > SPILL_ALLOWANCE else ""))
                    cells.append(" / ".join(cell) if cell else "")
                if any(cells):
                    lines.append(f"| {network}-1 | " + " | ".join(cells) + " |")
            lines.append("")
    lines += [
        f"`launch_config`'s choice against the least cost, among the configurations compiled, that spills at "
        f"most {SPILL_ALLOWANCE} bytes (or the fewest bytes of any, where all spill more):",
        "",
        "| kernel | products | network | sm | chosen | its cost | spills (bytes) | least | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {n: i for i, n in enumerate(NETWORKS)}
    for c in sorted(
        chosen_against_least(rows),
        key=lambda c: (c["kernel"], c["precision"], -c["capability"], order.get(c["network"], len(order))),
    ):
        cost = "not compiled" if c["cost"] is None else f"{c['cost']:.0f}"
        least = "" if c["least"] is None else f"{c['least']:.0f} ({c['least_config'][0]}×{c['least_config'][1]})"
        ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}"
        spills = "" if c["spill_stores"] is None else c["spill_stores"]
        lines.append(
            f"| {c['kernel']} | {c['precision']} | {c['network']}-1 | {c['capability']} | "
            f"{c['chosen'][0]}×{c['chosen'][1]} | {cost} | {spills} | {least} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+", default=NETWORKS)
    parser.add_argument("--configs", nargs="+", default=[f"{b}x{w}" for b, w in CONFIGS], help="block_n x num_warps, e.g. 64x4")
    parser.add_argument("--capabilities", nargs="+", type=int, default=list(CAPABILITIES))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--summary", metavar="JSON", help="compile nothing: print the summary of a file --json wrote")
    args = parser.parse_args(argv)
    if args.summary:
        with open(args.summary) as f:
            print(summary(json.load(f)["rows"]))
        return 0
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs]
    jobs = [
        (k, p, n, c, b, w)
        for k in args.kernels
        for p in args.precisions
        for n in args.networks
        for c in args.capabilities
        for b, w in configs
    ]
    rows = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for done in as_completed([pool.submit(row, *job) for job in jobs]):
            rows.append(done.result())
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress, and the rows of a run cut off
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "chosen": chosen_against_least(rows)}, f, indent=1)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
