"""``ebmcore.sampler.stream_seed``: the key of a fused run's noise stream, without a host sync on CUDA."""

from __future__ import annotations

import torch

from ebmcore.sampler import host_key, stream_seed


class FakeCudaGenerator:
    """What ``stream_seed`` uses of a CUDA ``torch.Generator`` (a CPU build of torch cannot make one)."""

    device = torch.device("cuda", 0)

    def __init__(self, seed: int) -> None:
        self.seed, self.offset = seed, 0

    def initial_seed(self) -> int:
        return self.seed

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> None:
        self.offset = offset


def test_on_the_cpu_the_key_is_one_draw_of_the_generator():
    g = torch.Generator().manual_seed(7)
    expected = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(7)))
    assert stream_seed(g, torch.device("cpu")) == expected


def test_on_cuda_the_key_comes_from_the_seed_and_offset_on_the_host_and_advances_the_offset():
    g = FakeCudaGenerator(1234)
    keys = [stream_seed(g, torch.device("cuda")) for _ in range(3)]
    assert g.offset == 12  # each key advances the Philox offset as one scalar draw does
    assert len(set(keys)) == 3 and all(0 <= k < 2**62 for k in keys)
    again = FakeCudaGenerator(1234)
    assert [stream_seed(again, torch.device("cuda")) for _ in range(3)] == keys  # reproducible from the seed
    assert stream_seed(FakeCudaGenerator(1235), torch.device("cuda")) != keys[0]


def test_host_keys_of_neighbouring_seeds_and_offsets_are_unrelated():
    keys = {host_key(seed, offset) for seed in range(64) for offset in range(0, 256, 4)}
    assert len(keys) == 64 * 64
    bits = torch.tensor([[(k >> b) & 1 for b in range(62)] for k in keys], dtype=torch.float64)
    # each bit is set in half the keys: 4,096 keys give a standard error of 0.0078 on the fraction
    assert (bits.mean(0) - 0.5).abs().max() < 6 * 0.0078


def test_threads_sharing_a_cuda_generator_get_different_keys():
    import threading

    g = FakeCudaGenerator(9)
    keys: list[int] = []
    threads = [
        threading.Thread(target=lambda: keys.extend(stream_seed(g, torch.device("cuda")) for _ in range(200))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 800 and len(set(keys)) == 800 and g.offset == 3200
