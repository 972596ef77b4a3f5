"""`python -m harness.serve` started badly: one line on stderr, a non-zero exit, no run folder left."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from harness.config import REPO_ROOT
from tests.harness.serve.conftest import SIM


def _serve(tmp_path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "harness.serve", *SIM, *argv], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("api_servers", [1, 2])
def test_a_port_in_use_is_one_line_and_exit_1(tmp_path, api_servers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve(tmp_path, [f"serve.port={port}", f"serve.api_servers={api_servers}"])
    assert result.returncode == 1
    line = _one_error_line(result)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line
    assert not (tmp_path / "outputs").exists()


def test_a_host_that_does_not_resolve_is_one_line_and_exit_1(tmp_path):
    result = _serve(tmp_path, ["serve.host=no-such-host.invalid", "serve.port=0"])
    assert result.returncode == 1
    assert "cannot listen on no-such-host.invalid:0 (serve.host, serve.port)" in _one_error_line(result)
    assert not (tmp_path / "outputs").exists()


# One case per path to the error line: the command line's check (check_arguments, whose other
# spellings tests/harness/test_arguments.py covers in-process) and the settings' own (ServeConfig).
@pytest.mark.parametrize("override, words", [
    ("serve.prot=8000", "serve.prot is not a config key (serve has ["),
    ("serve.tokenizer=/no/such/folder", "serve.tokenizer must be a folder holding a tokenizer (tokenizer.json or"),
])
def test_a_mistyped_key_or_option_is_one_line_and_exit_2(tmp_path, override, words):
    result = _serve(tmp_path, [override])
    assert result.returncode == 2
    assert words in _one_error_line(result)
    assert not (tmp_path / "outputs").exists()


def test_an_ipv6_host_is_announced_as_a_url_a_client_reaches(tmp_path):
    import httpx

    from harness.serve.process import ServerProcess

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with ServerProcess([*SIM, "serve.host=::1", "output.plots=false"], tmp_path / "serve") as server:
        assert server.base_url.startswith("http://[::1]:")  # the address bracketed, as URLs write it
        assert httpx.get(server.base_url.removesuffix("/v1") + "/health", timeout=30).status_code == 200
