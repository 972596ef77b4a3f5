"""Tokens computed ahead (sim.sampled.SampledTokens) are the tokens an executor samples: an
executor that reads them, where they cover a step, samples what one without them samples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.executor import BackendInfo
from sim import SampledTokens
from sim.executor import SimExecutor
from sim.roofline import RooflineCostModel
from tests.sim import helpers

VOCAB = 97  # small, so that the eos token is often drawn and replaced
RUNS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 400), st.integers(0, 150)), min_size=1, max_size=10)


def _executor(seed: int, eos: int | None, samples: SampledTokens | None = None) -> SimExecutor:
    cost = RooflineCostModel(helpers.model("qwen3-0.6b"), helpers.hardware("h100"))
    info = BackendInfo(num_blocks=8, block_size=4, vocab_size=VOCAB, eos_token_ids=() if eos is None else (eos,))
    return SimExecutor(cost, info, seed=seed, samples=samples)


@given(RUNS, st.lists(st.tuples(st.integers(0, 5), st.integers(0, 300), st.integers(1, 200)), max_size=6),
       st.integers(0, 2**64 - 1), st.sampled_from([None, 0, 5]))
@settings(max_examples=50)
def test_an_executor_reading_samples_samples_the_same_tokens(runs, ahead, seed, eos):
    """Whatever the samples cover (some requests, positions before, inside or past them)."""
    runs = [(f"r{r}", first, count) for r, first, count in runs]
    covered = {f"r{r}": (first, count) for r, first, count in ahead}  # one window per request
    samples = SampledTokens.ahead([(r, *window) for r, window in covered.items()], seed, VOCAB, eos)
    reading, hashing = _executor(seed, eos, samples), _executor(seed, eos)
    assert [list(t) for t in reading.sample_runs(runs)] == [list(t) for t in hashing.sample_runs(runs)]
    assert [reading.sample_tokens(*run) for run in runs] == [hashing.sample_tokens(*run) for run in runs]
    # a step's sampled entries, each at its position
    step = helpers.plan(*(helpers.decode(first + count, rid=r) for r, first, count in runs))
    assert reading.execute(step).token_ids == hashing.execute(step).token_ids


def test_samples_are_read_where_they_cover_a_step():
    samples = SampledTokens.ahead([("r0", 10, 20)], 3, VOCAB, None)
    assert samples.tokens["r0"][1] == _executor(3, None).sample_tokens("r0", 10, 20)
    reading = _executor(3, None, samples)
    marked = SampledTokens(3, VOCAB, None, {"r0": (10, [-1] * 20)})  # not what hashing gives: shows a read
    assert _executor(3, None, marked).sample_tokens("r0", 12, 5) == [-1] * 5
    assert _executor(3, None, marked).sample_tokens("r0", 25, 10) == reading.sample_tokens("r0", 25, 10)
    assert _executor(3, None, marked).execute(helpers.plan(helpers.decode(14, rid="r0"))).token_ids == [-1]


def test_samples_of_another_seed_vocabulary_or_eos_are_not_read():
    for seed, vocab, eos in ((4, VOCAB, None), (3, VOCAB + 1, None), (3, VOCAB, 5)):
        marked = SampledTokens(seed, vocab, eos, {"r0": (10, [-1] * 20)})
        assert not marked.suits(3, VOCAB, None)
        assert _executor(3, None, marked).sample_tokens("r0", 12, 5) == _executor(3, None).sample_tokens("r0", 12, 5)
