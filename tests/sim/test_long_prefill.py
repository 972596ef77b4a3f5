"""Long prefills: a profile whose true step cost is quadratic in the context (attention pairs)
is fitted so that long prompts and late chunks of a chunked prompt are priced within a few %,
also past the longest context the grid profiled (the pairs term extrapolates as a pair count,
so the extrapolation stays quadratic in the context)."""

from __future__ import annotations

import warnings

import pytest

from engine.core.config import SchedulerConfig
from engine.core.graph_sizes import GraphSizes, decode_graph_sizes, prefill_graph_sizes
from harness.calibration.profiling import LONG_PREFILL, ProfileGrid, profile_executor
from sim.features import attention_pairs, step_features
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from tests.sim.helpers import LawExecutor, plan, prefill

# the helpers' plans sample without seeds; the profile's rows all carry one
pytestmark = pytest.mark.filterwarnings("ignore:.*num_seeded")
GRAPHS = GraphSizes(decode_graph_sizes(512, 512), prefill_graph_sizes(4096))
# seconds: per step, per token (linear layers), per (query, key) pair (attention), per KV token read
STEP, TOKEN, PAIR, KV = 2e-3, 20e-6, 1.2e-9, 4e-9


def true_cost(features: dict) -> float:
    """A step's cost, quadratic in each prefill chunk's context through its attention pairs; a graph
    replays its padded size and skips the eager launches (the per-step constant)."""
    tokens = features["graph_batch_size"] if features["cuda_graph"] and features["num_prefill_tokens"] else \
        features["num_tokens"]
    launch = STEP * (0.3 if features["cuda_graph"] else 1.0)
    return (launch + TOKEN * tokens + PAIR * features["prefill_attention_pairs"]
            + KV * features["decode_context_tokens"])


@pytest.fixture(scope="module")
def fitted() -> tuple[ProfiledCostModel, object]:
    sched = SchedulerConfig(max_model_len=16386, max_num_batched_tokens=16384)
    grid = ProfileGrid(warmup=0, repeats=1, min_repeats=1, num_random=0, decode_batches=(1, 8, 64, 256),
                       decode_contexts=(512, 2048), prefill_seqs=(1, 4))
    profile = profile_executor(LawExecutor(true_cost, GRAPHS, num_blocks=2000, block_size=256), sched, grid)
    return ProfiledCostModel.fit(profile, GRAPHS), profile


def test_grid_profiles_long_chunks_eagerly_and_as_graphs(fitted):
    _, profile = fitted
    long = profile[profile["kind"] == LONG_PREFILL]
    eager = long[long["cuda_graph"] == 0]
    assert set(eager["num_prefill_tokens"]) == {1024, 2048, 3072, 4096, 5120, 6144, 8192}
    assert set(eager["prefill_context_tokens"]) == {0, 4096, 8192, 12288}
    assert set(long.loc[long["cuda_graph"] == 1, "num_prefill_tokens"]) == {1024, 2048, 3072, 4096}


@pytest.mark.parametrize("new, cached", [(4808, 0), (8192, 8192), (2000, 14000), (6000, 3000)])
def test_long_prompt_and_late_chunks_priced_within_3_percent(fitted, new, cached):
    model, _ = fitted
    step = plan(prefill(new, cached))
    truth = true_cost(step_features(step, GRAPHS))
    assert model.step_time(step) == pytest.approx(truth, rel=0.03)


@pytest.mark.parametrize("new, cached", [(4096, 28000), (8192, 24000)])
def test_context_beyond_the_profile_extrapolates_quadratically(fitted, new, cached):
    model, _ = fitted
    model._warned.clear()
    step = plan(prefill(new, cached))
    truth = true_cost(step_features(step, GRAPHS))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        predicted = model.step_time(step)
    assert any("prefill_attention_pairs" in str(w.message) for w in caught)  # documented, and told
    assert predicted == pytest.approx(truth, rel=0.03)
    # the attention share dominates: a linear-in-context price would be far off
    assert PAIR * attention_pairs(new, cached) > 0.5 * truth
