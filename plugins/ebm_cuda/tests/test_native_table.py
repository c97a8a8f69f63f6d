"""The native ops' table (``ebm_cuda.native``) against what it describes: each row's ctypes arguments against the C
declaration it names in ``host.cpp`` and ``kernels.cu`` (parsed, no compiler needed), its fake against its
implementation, and the ops and kernels the package defines against the rows; and the runtime's modules never load
the tests' machinery."""

from __future__ import annotations

import ctypes
import inspect
import re
import subprocess
import sys

import torch

from ebm_cuda import native
from ebm_cuda.build import CSRC

_SOURCES = {"host": CSRC / "host.cpp", "cuda": CSRC / "kernels.cu"}
_DECLARATION = re.compile(r"^int ebm_(host|cuda)_(\w+)\(([^)]*)\)\s*\{", re.MULTILINE)
_SCALARS = {
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "double": ctypes.c_double,
    "float": ctypes.c_float,
}
_EXECUTION = {"host": ("int", ctypes.c_int), "cuda": ("void*", ctypes.c_void_p)}


def _declarations() -> dict[tuple[str, str], list[str]]:
    """``(build, symbol) -> [the C type of each parameter]`` of every exported function of the two sources."""
    found = {}
    for build, path in _SOURCES.items():
        for prefix, symbol, params in _DECLARATION.findall(path.read_text()):
            assert prefix == build, f"{path.name} exports ebm_{prefix}_{symbol}"
            types = []
            for param in (p.strip() for p in params.split(",") if p.strip()):
                name = re.search(r"(\w+)$", param).group(1)
                types.append(re.sub(r"\s+", "", param[: -len(name)]))
            found[(build, symbol)] = types
    return found


def _fits(c_type: str, ctype: object) -> bool:
    """Whether ctypes ``ctype`` passes a C parameter of type ``c_type`` (``"constfloat*const*"``, ``"int64_t"``)."""
    if "*" in c_type:
        return ctype is ctypes.c_void_p or (isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer))
    return _SCALARS.get(c_type.removeprefix("const")) is ctype


def test_every_rows_ctypes_arguments_match_the_c_declaration_it_names():
    declared = _declarations()
    rows = native.table()
    bound = set()
    for row in rows.values():
        if row.symbol is None:
            assert row.argtypes == () and row.impl is not None, f"{row.name}: a row without a C function is a Triton op"
            continue
        for build in row.builds:
            key = (build, row.symbol)
            assert key in declared, f"{row.name}: no ebm_{build}_{row.symbol} in {_SOURCES[build].name}"
            bound.add(key)
            c_types = declared[key]
            argtypes = list(row.argtypes)
            if build in row.execution:
                c_name, ctype = _EXECUTION[build]
                assert c_types and c_types[-1].replace("const", "") == c_name, (
                    f"ebm_{build}_{row.symbol} ends with {c_types[-1:]}, not the execution argument {c_name}"
                )
                argtypes.append(ctype)
            assert len(c_types) == len(argtypes), (
                f"ebm_{build}_{row.symbol}: {len(c_types)} parameters in C, {len(argtypes)} in the row {row.name}"
            )
            for i, (c_type, ctype) in enumerate(zip(c_types, argtypes)):
                assert _fits(c_type, ctype), f"ebm_{build}_{row.symbol} parameter {i}: C {c_type}, ctypes {ctype}"
    unbound = set(declared) - bound
    assert unbound == set(), f"C functions without a row (their argument types would be unset): {sorted(unbound)}"


def test_every_rows_fake_takes_the_parameters_of_its_implementation():
    for row in native.table().values():
        if row.impl is None:
            assert row.fake is None and row.kernel is None, row.name
            continue
        assert row.fake is not None, f"{row.name} has no fake: torch.compile could not trace it"
        impl, fake = inspect.signature(row.impl).parameters, inspect.signature(row.fake).parameters
        assert list(impl) == list(fake), f"{row.name}: implementation {list(impl)}, fake {list(fake)}"
        assert set(row.mutates_args) <= set(impl), row.name


def test_the_defined_ops_and_the_backends_kernels_are_the_rows():
    from ebm_cuda.backends import CudaBackend, HostBackend, TritonBackend

    rows = native.table()
    defined = {n for n in dir(torch.ops.ebm_cuda) if isinstance(getattr(torch.ops.ebm_cuda, n), torch._ops.OpOverloadPacket)}
    assert defined == {name for name, row in rows.items() if row.impl is not None}
    for backend in (HostBackend(), TritonBackend(), CudaBackend()):
        from_rows = {k.op: k for k in native.kernels(backend.name)}
        assert all(backend.kernels[op].fn is k.fn for op, k in from_rows.items()), backend.name
    assert set(native.kernels("triton")) and {k.op for k in native.kernels("triton")} == set(TritonBackend().kernels)
    for row in rows.values():
        assert (row.kernel is None) == (row.backend is None), row.name


def test_the_runtime_never_imports_the_tests_machinery():
    """``ebm_cuda.testing`` (the GPU tests' helpers, the CUDA emulation, the Triton chain on given noise) and
    ``ebm_cuda.kernel_report`` (compile reports) are for the tests and benchmarks: loading every runtime module, the
    backends and every op leaves them unloaded."""
    code = (
        "import sys, ebm_cuda, ebm_cuda.plugin, ebm_cuda.backends, ebm_cuda.ops, ebm_cuda.cli, ebm_cuda.reference\n"
        "from ebm_cuda import native\n"
        "native.table()\n"
        "print(sorted(m for m in sys.modules if m in ('ebm_cuda.testing', 'ebm_cuda.kernel_report', 'triton')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
