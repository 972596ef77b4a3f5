"""Shared helpers: compose the real conf/ with overrides, as `python -m harness` would."""

from __future__ import annotations

import copy
import functools

import pytest
from hydra import compose, initialize_config_dir

from harness.config import CONF_DIR

QUIET = ["output.progress=false"]


@functools.lru_cache(maxsize=32)  # the repeats come close together: 32 keep nearly all hits
def _composed(config_name: str, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def compose_named(config_name: str, overrides: list[str]):
    """conf/<config_name>.yaml with the overrides, as Hydra composes it. A compose takes ~0.15 s and
    the suite asks for the same overrides again and again (a module's tests, parametrized cases), so
    each is composed once; every caller gets a copy of its own, free to change. conf/ does not change
    while the tests run, and a compose that fails is not kept: the next call raises again."""
    return copy.deepcopy(_composed(config_name, tuple(overrides)))


def compose_config(overrides: list[str]):
    return compose_named("config", QUIET + list(overrides))


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


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """One trace path for all of a property test's examples, each writing its trace there before
    its run: the same overrides each time, so the configuration is composed once."""
    return tmp_path_factory.mktemp("trace") / "t.jsonl"
