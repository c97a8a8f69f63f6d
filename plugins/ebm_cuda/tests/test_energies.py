"""The energies of the kernels are written once, in csrc/ebm/energies.h, for C++ and Python; each energy's
parameters reach the kernels' (v0, v1, a, b) through its declared parameter table."""

import subprocess

import pytest
import torch

import ebmcore
from ebmcore.energies import AnalyticEnergy, builtin_analytic_energies, matrix, scalar, tensor, vector
from ebmcore.errors import InputError
from ebm_cuda import build, energies, ops
from ebm_cuda.energies import KINDS, LAYOUTS, Layout, read_kinds

CXX = build.find_cxx()

_PRINT_KINDS = r"""
#include <cstdio>
#include "ebm/energies.h"
#define EBM_PRINT_KIND(ENUM, CODE, NAME, ...) std::printf("%s %d %d\n", #NAME, (int)ebm::ENUM, CODE);
int main() { EBM_ENERGIES(EBM_PRINT_KIND, ) return 0; }
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (set CXX)")
def test_the_python_kinds_are_the_header_enum_compiled(tmp_path):
    source, exe = tmp_path / "kinds.cpp", tmp_path / "kinds"
    source.write_text(_PRINT_KINDS)
    run = subprocess.run([CXX, "-std=c++17", f"-I{build.CSRC}", str(source), "-o", str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()]
    assert {name: int(enum) for name, enum, _ in rows} == KINDS  # the compiled enum: codes and names
    assert all(enum == code for _, enum, code in rows)
    assert ops.KINDS is KINDS and list(KINDS) == ["gaussian", "double_well", "rosenbrock", "harmonic"]


def test_every_kind_is_a_builtin_analytic_energy_with_the_same_op():
    for name, layout in LAYOUTS.items():
        assert layout.energy is builtin_analytic_energies()[name] and layout.code == KINDS[name]


def test_the_header_list_is_read_strictly():
    text = "#define EBM_ENERGIES(X, ...)                  \\\n  X(ONE, 0, one, __VA_ARGS__)          \\\n  X(TWO, 1, two, __VA_ARGS__)\n\nX(THREE, 2, three, __VA_ARGS__)\n"
    assert read_kinds(text) == {"one": 0, "two": 1}  # the macro ends at the first line without a backslash
    with pytest.raises(RuntimeError, match="no '#define EBM_ENERGIES"):
        read_kinds("enum Kind { A = 0 };")
    with pytest.raises(RuntimeError, match=r"expected 'X\(KIND, code, name, __VA_ARGS__\)'"):
        read_kinds("#define EBM_ENERGIES(X, ...) \\\n  X(ONE, zero, one, __VA_ARGS__)\n")
    with pytest.raises(RuntimeError, match="listed twice"):
        read_kinds("#define EBM_ENERGIES(X, ...) \\\n  X(ONE, 0, one, __VA_ARGS__) \\\n  X(TWO, 0, two, __VA_ARGS__)\n")


def test_kernel_args_map_to_the_kernels_slots_by_the_declared_table():
    mean, precision = torch.zeros(3), torch.eye(3)
    assert LAYOUTS["gaussian"].unpack(mean, precision) == (mean, precision, 0.0, 0.0)
    assert LAYOUTS["double_well"].unpack(2.0) == (None, None, 2.0, 0.0)
    assert LAYOUTS["rosenbrock"].unpack(1.0, 100.0) == (None, None, 1.0, 100.0)
    center = torch.ones(3)
    assert LAYOUTS["harmonic"].unpack(center, 2.5) == (center, None, 2.5, 0.0)
    energy = ebmcore.HarmonicEnergy(dim=3, stiffness=4.0)
    v0, v1, a, b = LAYOUTS["harmonic"].unpack(*energy.kernel_args())
    assert v0 is energy.center and v1 is None and (a, b) == (4.0, 0.0)


def test_a_table_that_does_not_fit_the_kernels_is_refused_by_name():
    class TwoVectors(AnalyticEnergy):
        op = "two_vectors"
        params = (vector("u"), vector("w"))

    class Mixture(AnalyticEnergy):
        op = "mixture"
        params = (tensor("means", ("K", "d"), lambda d, g: torch.zeros(2, d)),)

    with pytest.raises(TypeError, match=r"w: \(d,\) is one too many"):
        Layout.of("two_vectors", 9, TwoVectors)
    with pytest.raises(TypeError, match=r"means: \(K, d\) is one too many"):
        Layout.of("mixture", 9, Mixture)
    fits = type("Fits", (AnalyticEnergy,), {"op": "fits", "params": (scalar("s", 1.0), matrix("m"), scalar("t", 2.0))})
    assert Layout.of("fits", 9, fits).slots == ("a", "v1", "b")


def test_a_header_energy_without_a_python_class_is_an_error(monkeypatch):
    monkeypatch.setattr(energies, "KINDS", {**KINDS, "quartic": 7})
    with pytest.raises(RuntimeError, match=r"lists \['quartic'\] in EBM_ENERGIES, but ebmcore has no analytic energy"):
        energies._layouts()


def test_the_ops_check_the_parameter_tensors_against_the_table():
    x = torch.randn(10, 3)
    with pytest.raises(InputError, match=r"energy gaussian \(kind 0\) needs its parameter tensors: precision \(d, d\) as v1"):
        ops.call("energy", x, KINDS["gaussian"], torch.zeros(3), None, 0.0, 0.0, False)
    with pytest.raises(InputError, match=r"energy harmonic \(kind 3\) takes no v1; pass None"):
        ops.call("energy", x, KINDS["harmonic"], torch.zeros(3), torch.eye(3), 1.0, 0.0, False)
    with pytest.raises(InputError, match=r"gaussian's precision \(v1\) of shape \(2, 2\) does not fit dim 3: expected \(d, d\)"):
        ops.call("energy", x, KINDS["gaussian"], torch.zeros(3), torch.eye(2), 0.0, 0.0, False)
    with pytest.raises(InputError, match="unknown energy kind 99"):
        ops.call("energy", x, 99, None, None, 0.0, 0.0, False)
