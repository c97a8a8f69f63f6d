"""``ebm cuda info`` (what can run here, and why not) and ``ebm cuda build`` (compile ahead of use)."""

from __future__ import annotations

import argparse

import torch

from ebm_cuda import build, library, triton_chains
from ebm_cuda.commands import ARGUMENTS, COMMANDS
from ebm_cuda.library import gpu_absent_reason


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("cuda", help=COMMANDS["cuda"])
    ARGUMENTS["cuda"](parser)  # declared without torch, for `ebm cuda --help` (ebmcore.commands)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return {"info": _info, "build": _build}[args.cuda_command](args)


def _info(args: argparse.Namespace) -> int:
    print(f"cache: {build.cache_dir()}")
    print(f"c++: {build.find_cxx() or 'not found'}    nvcc: {build.find_nvcc() or 'not found'}")
    print(
        f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, devices: {torch.cuda.device_count() if torch.version.cuda else 0}"
    )
    for name, reason in (
        ("cpu_fused", library.host_unavailable_reason()),
        ("cuda", library.cuda_unavailable_reason()),
        ("triton", triton_chains.unavailable_reason()),
    ):
        print(f"{name:10} {'available' if reason is None else 'unavailable: ' + reason}")
    setting = torch.get_float32_matmul_precision()
    for kernel, contrastive in (("chain", False), ("contrastive chain", True)):
        products, slower = triton_chains.declared_products(contrastive)(None)
        rank = "runs at fused=None" if slower is None else f"fused=True only: it {slower}"
        print(f"triton {kernel}: {products} products (torch.get_float32_matmul_precision() is {setting!r}); {rank}")
    from ebm_cuda import feedforward_ops

    host = feedforward_ops.host_products(None)[0] or "ieee"
    print(
        f"cpu_fused feed-forward chain: {host} products ({setting!r}; 'medium' or precision='bf16' asks for bf16: "
        f"{feedforward_ops.bf16_instructions()})"
    )
    return 0


def _build(args: argparse.Namespace) -> int:
    try:
        print(f"host kernels: {build.build_host()}")
        if not args.host_only:
            archs = args.arch
            if not archs:
                reason = library.cuda_unavailable_reason()
                if reason and gpu_absent_reason() is None:  # a GPU that the kernels cannot run on: an error, not a skip
                    print(f"error: a GPU is present but the CUDA kernels cannot run on it: {reason}")
                    return 1
                if reason:
                    print(f"CUDA kernels: skipped ({reason}); pass --arch 80 90 to build for given GPUs")
                    return 0
                archs = ["{}{}".format(*torch.cuda.get_device_capability())]
            for arch in archs:  # one library per architecture: what a device of that capability loads
                print(f"CUDA kernels for sm_{arch}: {build.build_cuda([arch])}")
    except build.BuildError as exc:
        print(f"error: {exc}")
        return 1
    return 0
