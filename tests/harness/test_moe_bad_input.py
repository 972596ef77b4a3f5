"""Issue 33's bad mixture-of-experts input through the harness: one line naming the problem.

The harness side runs in process: a ConfigError is what `python -m harness` prints as its one
line with exit 2 (tests/harness/test_outputs.py checks that through the real entry point). The
engine's own messages are checked in tests/engine/test_moe.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from harness.convert import ConfigError
from harness.scripting import compose_run_config
from harness.study import run_study
from tests.harness.conftest import compose_config

ENGINE = ["backend=engine", "model=tiny-qwen3-moe", "hardware=cpu", "backend.device=cpu",
          "scheduler.max_model_len=2048", "output.plots=false"]


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    from engine.checkpoint import write_checkpoint

    out = tmp_path_factory.mktemp("tiny-qwen3-moe")
    write_checkpoint("tiny-qwen3-moe", out)
    return out


def _one_line(tmp_path, overrides: list[str]) -> str:
    cfg = compose_config(ENGINE + overrides)
    with pytest.raises(ConfigError) as error:
        run_study(cfg, tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message
    return message


def test_more_experts_per_token_than_experts_in_a_checkpoint(tmp_path, moe_checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(moe_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": config["num_experts"] + 1}))
    message = _one_line(tmp_path, [f"backend.model={folder}"])
    assert message.endswith("num_experts_per_tok (9) must not exceed num_experts (8)")


def test_more_experts_per_token_than_experts_in_the_model_group():
    with pytest.raises(ConfigError, match=r"num_experts_per_tok \(200\) must not exceed num_experts \(128\)"):
        compose_run_config(["model=qwen3-30b-a3b", "+model.num_experts_per_tok=200"])


def test_a_checkpoint_missing_an_expert_tensor(tmp_path, moe_checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(moe_checkpoint, folder)
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    message = _one_line(tmp_path, [f"backend.model={folder}"])
    assert message.endswith("lacks 1 tensor(s) the model needs: model.layers.1.mlp.experts.5.up_proj.weight")


def test_dummy_weights_of_a_folder_without_a_shape(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    message = _one_line(tmp_path, [f"backend.model={empty}", "backend.load_format=dummy"])
    assert f"load_format='dummy': model '{empty}' has no shape" in message
