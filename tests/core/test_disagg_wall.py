"""The disaggregated wall-clock router's messages (engine.core.disagg_wall): a prefill replica is
told to send a request's KV only after the decode replica reserved blocks for it and posted the
receive, so until then the blocks stay held on the prefill replica (the simulated fleet's
back-pressure) and no copy of them waits outside a cache."""

from __future__ import annotations

from engine.core import Request, SamplingParams
from engine.core.disagg import prefill_copy
from engine.core.disagg_types import Transfer
from engine.core.disagg_wall import _Router
from engine.core.remote_replica import Report
from engine.core.request import FinishReason, RequestStatus
from engine.core.routers import RouterConfig, make_router


class RecordingLinks:
    def __init__(self, n: int) -> None:
        self.n, self.sent = n, []

    def __len__(self) -> int:
        return self.n

    def send(self, index, kind, payload) -> None:
        self.sent.append((index, kind, payload))


def _finished_copy(rid: str) -> Request:
    copy = prefill_copy(Request(rid, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)))
    copy.token_ids.append(7)
    copy.first_token_time = copy.finish_time = 0.1
    copy.status, copy.finish_reason = RequestStatus.FINISHED, FinishReason.LENGTH
    return copy


def test_the_send_waits_for_the_decode_replicas_reservation():
    links = RecordingLinks(3)  # prefill 0, decode 1 and 2
    router = _Router(links, 1, make_router(RouterConfig("round_robin"), 16), 64, None)
    for rid in ("a", "b"):
        router.originals[rid] = Request(rid, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        router.transfers[rid] = Transfer(0)
        router.unresolved += 1
    router.handle(0, "report", Report([], [_finished_copy("a"), _finished_copy("b")], {}, 0, 0))
    kinds = [(index, kind) for index, kind, _ in links.sent]
    assert kinds == [(1, "receive_kv"), (2, "receive_kv")]  # nothing to the prefill replica yet
    assert links.sent[0][2][1] == 0 and links.sent[0][2][0].request_id == "a"
    links.sent.clear()
    router.handle(2, "reserved", "b")  # reservations may come in any order across decode replicas
    router.handle(1, "reserved", "a")
    assert links.sent == [(0, "send_kv", ("b", 2)), (0, "send_kv", ("a", 1))]
    assert router.transfers["a"].decode == 0 and router.transfers["b"].decode == 1 and not router.senders
