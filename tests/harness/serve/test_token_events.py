"""With return_token_ids, a stream has an event for every delivery of tokens, also when they add no
text yet (an incomplete character, or ids the tokenizer has no text for, as a random-weight model
with a tokenizer smaller than its vocabulary samples): a client timing tokens sees each arrive.
Without it, such deliveries give no event (the OpenAI stream carries text)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from engine.core.request import FinishReason
from engine.core.sampling_params import SamplingParams
from harness.serve.core import CoreSnapshot, Delivery
from harness.serve.generation import Generation
from harness.serve.metrics import ServerMetrics


class SilentOnOdd:
    """A decoder whose odd ids have no text (ids beyond a small tokenizer's range)."""

    def add(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids if i % 2 == 0)


async def _pieces(keep_empty: bool, ids: list[int]) -> list[list[str]]:
    codec = SimpleNamespace(decoder=SilentOnOdd)
    metrics = ServerMetrics(SimpleNamespace(snapshot=CoreSnapshot()), "m")
    core = SimpleNamespace(abort=lambda request_id: None)
    gen = Generation(core, codec, metrics, [1, 2, 3], SamplingParams(max_tokens=len(ids)), [])
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        gen._receive(Delivery([token], FinishReason.LENGTH if last else None, time.perf_counter()))
    out = []
    async for batch in gen.deltas(keep_empty=keep_empty):
        out.append(batch)
    return out


@pytest.mark.parametrize("keep_empty", [True, False])
def test_a_delivery_without_text_is_an_event_only_when_token_ids_are_asked_for(keep_empty):
    ids = [1, 3, 4, 5, 6]  # 1, 3 and 5 add no text
    pieces = [p for batch in asyncio.run(_pieces(keep_empty, ids)) for p in batch]
    if keep_empty:
        assert pieces == ["", "", "<4>", "", "<6>"]
    else:
        assert pieces == ["<4>", "<6>"]

