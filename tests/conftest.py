"""Settings of every test of the suite."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _single_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core runner OpenMP's
    spinning threads slow each forward down by 10-50x; one thread keeps the suite fast. It covers
    the engine runs of the harness's tests too (a compare, a fidelity run, a CPU fleet), and the
    processes the engine spawns (tensor-parallel workers, replicas), which take the engine's count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
