"""Stopping a server while clients stream: each stream ends at once with an abort, not after
uvicorn's graceful timeout with its connection cut mid-body."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.harness.serve.conftest import SIM, start_server

MODEL = "qwen3-8b"


def test_stop_ends_open_streams_with_abort_at_once():
    server = start_server([*SIM, "serve.time_scale=1"])
    url = f"http://127.0.0.1:{server.port}/v1/completions"
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 3000, "ignore_eos": True}
    events: dict[int, list[str]] = {}
    plain: list[httpx.Response] = []
    errors: list[BaseException] = []
    started = threading.Barrier(5)  # three streams, the plain request, this thread

    def stream(i: int) -> None:
        try:
            with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
                lines = response.iter_lines()
                events[i] = [next(lines)]
                started.wait()
                events[i] += [line for line in lines if line]
        except BaseException as error:  # noqa: BLE001 - the assertion below reports it
            errors.append(error)

    def one_plain() -> None:
        started.wait()
        try:
            plain.append(httpx.post(url, json=body, timeout=60))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    clients = [threading.Thread(target=stream, args=(i,)) for i in range(3)] + [threading.Thread(target=one_plain)]
    for client in clients:
        client.start()
    started.wait(timeout=60)
    time.sleep(0.3)  # the plain request is in
    began = time.perf_counter()
    outcome = server.stop()
    stop_s = time.perf_counter() - began
    for client in clients:
        client.join(60)
    assert not errors, errors
    # uvicorn's graceful timeout is 5 s; the streams must not wait for it
    assert stop_s < 3.0
    for lines in events.values():
        assert lines[-1] == "data: [DONE]"
        finish = json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"]
        assert finish == "abort"
    assert plain[0].status_code == 200 and plain[0].json()["choices"][0]["finish_reason"] == "abort"
    assert list(outcome.requests["finish_reason"]) == ["aborted"] * 4
