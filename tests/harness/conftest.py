"""Shared helpers: compose the real conf/ with overrides, as `python -m harness` would."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from harness.config import CONF_DIR

QUIET = ["output.progress=false"]


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=QUIET + list(overrides))


@pytest.fixture
def composed():
    return compose_config


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny-qwen3 checkpoint for the engine-backed harness tests (written once per session)."""
    from engine.checkpoint import write_checkpoint

    out = tmp_path_factory.mktemp("tiny-qwen3")
    write_checkpoint("tiny-qwen3", out)
    return out
