"""The Philox4x32-10 stream: published known answers, and the host build against the PyTorch reference."""

import pytest
import torch

from ebmcore.errors import InputError
from ebm_cuda import ops, reference

# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key, output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("impl", [ops.philox4x32, reference.philox4x32], ids=["host", "reference"])
def test_known_answers(impl):
    counters = torch.tensor([c for c, _, _ in KAT])
    keys = torch.tensor([k for _, k, _ in KAT])
    assert impl(counters, keys).tolist() == [list(out) for _, _, out in KAT]


def test_host_and_reference_agree_on_random_counters():
    g = torch.Generator().manual_seed(0)
    counters = torch.randint(0, 2**32, (500, 4), generator=g)
    keys = torch.randint(0, 2**32, (500, 2), generator=g)
    assert torch.equal(ops.philox4x32(counters, keys), reference.philox4x32(counters, keys))


@pytest.mark.parametrize("d", [1, 4, 7])
def test_normal_stream_matches_reference(d):
    # The kernels' log/sincos are ~1-ulp polynomials: agreement to a few float32 ulps.
    z, expected = ops.normal(2000, d, seed=2**40 + 7, step=2**33 + 5), reference.normal(2000, d, seed=2**40 + 7, step=2**33 + 5)
    torch.testing.assert_close(z, expected, rtol=2e-6, atol=2e-6)


def test_normal_stream_moments_and_independence():
    z = ops.normal(50_000, 4, seed=3, step=0).flatten().double()
    n = z.numel()
    assert abs(z.mean()) < 5 / n**0.5  # mean 0 within 5 SE
    assert abs(z.var() - 1) < 5 * (2 / n) ** 0.5  # variance 1 within 5 SE
    assert abs((z**4).mean() - 3) < 5 * (96 / n) ** 0.5  # normal kurtosis (var of z^4 is 96)
    other = ops.normal(50_000, 4, seed=3, step=1).flatten().double()
    assert abs((z * other).mean()) < 5 / n**0.5  # successive steps uncorrelated


def test_uniform_matches_reference():
    u = ops.uniform(1000, seed=99, step=12)
    assert torch.equal(u, reference.uniform(1000, 99, 12))
    assert 0 <= u.min() and u.max() < 1


def test_the_host_build_never_reads_tensors_off_the_cpu():
    """Where no CUDA build runs them, the stream's tensors go to the host build, which reads them from the CPU: tensors
    on another device (``meta`` here: no memory) are refused by name instead."""
    counters = torch.zeros(3, 4, dtype=torch.int64, device="meta")
    with pytest.raises(
        InputError, match=r"ebm_cuda\.philox4x32: the host build runs it, on CPU tensors only; got tensors on meta"
    ):
        ops.philox4x32(counters, counters[:, :2])
    with pytest.raises(InputError, match=r"ebm_cuda\.normal: the host build runs it, on CPU tensors only; got tensors on meta"):
        ops.normal(3, 4, seed=0, step=0, device="meta")
