"""A workload's requests made once and served many times: a plan serves one workload on every
deployment it evaluates, and what the requests are does not depend on the deployment.

Made once: the requests' token ids (build_workload's, the same objects), their prompts' block
hashes (engine.core.block_manager's chained hashes, a function of the tokens and the block size)
and the tokens the simulator samples for them (sim.sampled.SampledTokens). Each serve() takes
fresh Requests (requests()), since a run changes its requests; they start with the hashes of
their full prompt blocks, which the block manager would compute the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core import Request
from engine.core.block_manager import BlockManager
from harness.workloads.build import Workload, build_workload
from harness.workloads.config import WorkloadConfig
from sim.sampled import SampledTokens


@dataclass(frozen=True)
class Drawn:
    """What the requests were made for: another workload, length limit, vocabulary or block size
    makes other requests (harness.fleet.run then builds its own)."""

    workload: WorkloadConfig
    max_model_len: int
    vocab_size: int
    block_size: int


class PreparedWorkload:
    """cfg's requests for max_model_len and vocab_size (build_workload's), prompt hashes for
    block_size, and the tokens an executor of (seed, vocab_size, eos_token_id) samples for them."""

    def __init__(self, drawn: Drawn, seed: int, eos_token_id: int | None) -> None:
        self.drawn = drawn
        self.workload: Workload = build_workload(drawn.workload, drawn.max_model_len, drawn.vocab_size)
        self._templates = self.workload.requests  # never served: requests() copies them
        # A lookup in an empty cache hashes the prompt's blocks (what a first admission looks up)
        # onto the request and finds nothing.
        hasher = BlockManager(1, drawn.block_size)
        for request in self._templates:
            hasher.lookup(request)
        runs = [(r.request_id, r.num_prompt_tokens, r.max_tokens) for r in self._templates if r.max_tokens]
        self.samples = SampledTokens.ahead(runs, seed, drawn.vocab_size, eos_token_id)

    def requests(self) -> list[Request]:
        """Fresh requests, as build_workload would make them, each with its prompt's block hashes."""
        fresh = []
        for template in self._templates:
            request = Request(template.request_id, template.token_ids, template.sampling_params,
                              arrival_time=template.arrival_time)
            request.block_hashes = template.block_hashes.copy()
            fresh.append(request)
        return fresh

    def __len__(self) -> int:
        return len(self._templates)
