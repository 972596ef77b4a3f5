"""Settings of every test of the suite."""

from __future__ import annotations

import gc

import pytest

# Files of the suite's longest tests (30-60 s each on a 2-core runner), handed out first: run
# in collection order they came last, and under `-n auto` one worker ran them while the other idled.
LONGEST_FIRST = ("tests/test_readme.py", "tests/harness/serve/test_loadgen.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The LONGEST_FIRST files' tests first, every other test in its collection order after them."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))


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


@pytest.fixture(autouse=True)
def _heap_unfrozen_after_each_test():
    """A server started in the test process (harness.serve.server, a thread) freezes the heap, as a
    process that only serves should, and nothing unfreezes it. Left frozen, the objects of every
    later test joined it, and each later run paid for the size of the frozen list:
    harness.run.cyclic_gc_paused asks gc.get_freeze_count(), a walk over that list (~50 ms a run
    late in the suite, seconds for a test of many runs). Each test starts with nothing frozen."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
