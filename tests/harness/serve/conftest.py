"""Servers for the tests: built from the real conf/ (conf/serving.yaml), each on a free port (port 0)."""

from __future__ import annotations

import pytest

# Without the serve extra (the GPU machine's image has no ASGI stack) these tests skip as one group
# instead of failing the whole run's collection.
for module in ("fastapi", "uvicorn"):
    pytest.importorskip(module, reason="needs the serve extra: pip install -e '.[serve]'")

from harness.config import build_run_config, section  # noqa: E402
from harness.convert import to_dataclass  # noqa: E402
from harness.serve.config import ServeConfig  # noqa: E402
from harness.serve.server import ServerThread  # noqa: E402
from tests.harness.conftest import compose_named  # noqa: E402

SIM = ["backend=sim", "model=qwen3-8b", "hardware=h100"]


def start_server(overrides: list[str]) -> ServerThread:
    cfg = compose_named("serving", ["serve.port=0", *overrides])
    server = ServerThread(build_run_config(cfg), to_dataclass(ServeConfig, section(cfg, "serve"), "serve"))
    server.start()
    return server


@pytest.fixture
def sim_server():
    """A simulated H100 serving Qwen3-8B, 20x faster than real time."""
    server = start_server([*SIM, "serve.time_scale=20"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_sim_server():
    """sim_server, one for a module's tests that only send requests and read the answers (none
    counts what the server served, nor stops it): a start and a stop cost ~0.7 s on CI."""
    server = start_server([*SIM, "serve.time_scale=20"])
    yield server
    server.stop()
