"""Random-weight checkpoints: published shapes, determinism, HF-loadable layout, tokenizer."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.checkpoint import is_complete, main, write_checkpoint
from engine.core.model_shapes import ModelShape
from engine.models.presets import PRESETS, hf_tensor_shapes, preset_config


def _digest(d) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


# (layers, hidden, heads, kv heads, intermediate, tied, published parameter count in billions)
PUBLISHED = {
    "qwen3-0.6b": (28, 1024, 16, 8, 3072, True, 0.6),
    "qwen3-4b": (36, 2560, 32, 8, 9728, True, 4.0),
    "qwen3-8b": (36, 4096, 32, 8, 12288, False, 8.2),
    "qwen3-32b": (64, 5120, 64, 8, 25600, False, 32.8),
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_qwen3_presets_carry_published_config(preset):
    cfg = preset_config(preset)
    layers, hidden, heads, kv, inter, tied, billions = PUBLISHED[preset]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (layers, hidden, heads)
    assert (cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["tie_word_embeddings"]) == (kv, inter, tied)
    assert (cfg["head_dim"], cfg["vocab_size"], cfg["rope_theta"]) == (128, 151936, 1000000)
    assert (cfg["rms_norm_eps"], cfg["max_position_embeddings"], cfg["torch_dtype"]) == (1e-6, 40960, "bfloat16")
    params = sum(math.prod(shape) for _, shape in hf_tensor_shapes(ModelShape.from_hf_config(cfg)))
    assert params / 1e9 == pytest.approx(billions, abs=0.05)


def test_unknown_preset_and_dtype_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="preset='qwen9'.*expected one of"):
        write_checkpoint("qwen9", tmp_path)
    with pytest.raises(ValueError, match="dtype='int4'.*expected one of"):
        write_checkpoint("tiny-qwen3", tmp_path, dtype="int4")


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = _digest(write_checkpoint("tiny-qwen2", tmp_path / "a", seed=7))
    b = _digest(write_checkpoint("tiny-qwen2", tmp_path / "b", seed=7))
    c = _digest(write_checkpoint("tiny-qwen2", tmp_path / "c", seed=8))
    assert a == b
    assert c["model.safetensors"] != a["model.safetensors"]
    assert c["config.json"] == a["config.json"] and c["tokenizer.json"] == a["tokenizer.json"]


def test_tokenizer_is_deterministic_across_processes(tmp_path):
    # Hash-map iteration order changes between processes; the trained merges must not.
    code = "from engine.tokenizer_builder import build_tokenizer; print(build_tokenizer().to_str())"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(outs) == 1


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen2", "tiny-llama"])
def test_tensor_names_and_shapes_are_what_transformers_expects(preset, tmp_path):
    d = write_checkpoint(preset, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    expected = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    if preset_config(preset)["tie_word_embeddings"]:
        expected.pop("lm_head.weight")
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        written = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert written == expected


def test_weights_have_real_model_scale(tiny_qwen3_dir):
    with safe_open(str(tiny_qwen3_dir / "model.safetensors"), framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
        norm = f.get_tensor("model.layers.0.self_attn.q_norm.weight")
    assert emb.std().item() == pytest.approx(0.02, rel=0.05) and abs(emb.mean().item()) < 2e-3
    assert torch.equal(norm, torch.ones_like(norm))


def test_dtype_override_and_sharded_index(tmp_path):
    d = write_checkpoint("tiny-llama", tmp_path, dtype="bfloat16", max_shard_bytes=60_000)
    assert json.loads((d / "config.json").read_text())["torch_dtype"] == "bfloat16"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    total = 0
    for name, fname in index["weight_map"].items():
        with safe_open(str(d / fname), framework="pt") as f:
            t = f.get_tensor(name)
        assert t.dtype == torch.bfloat16
        total += t.numel() * 2
    assert index["metadata"]["total_size"] == total
    names = set(index["weight_map"])
    assert names == {n for n, _ in hf_tensor_shapes(ModelShape.from_hf_config(preset_config("tiny-llama")))}


def test_rewrite_with_other_sharding_leaves_no_stale_shards(tmp_path):
    write_checkpoint("tiny-qwen3", tmp_path, max_shard_bytes=50_000)
    write_checkpoint("tiny-qwen3", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]


def test_autotokenizer_round_trip_and_special_tokens(tiny_qwen3_dir):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    config = json.loads((tiny_qwen3_dir / "config.json").read_text())
    for text in ["Hello, world!", "  spaces\tand\nnewlines ", "naïve café 東京 🙂", "def f(x):\n    return x"]:
        ids = tok.encode(text)
        assert max(ids) < config["vocab_size"]
        assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"]
    assert tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>") == config["bos_token_id"]
    assert len(tok) <= config["vocab_size"]
    # no bos is silently prepended, and specials are single tokens
    assert tok.encode("<|im_start|>hi<|im_end|>")[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.encode("<|im_start|>hi<|im_end|>")[-1] == tok.eos_token_id
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(["--preset", "tiny-llama", "--out", str(tmp_path / "cli"), "--seed", "3"])
    assert "wrote tiny-llama" in capsys.readouterr().out
    assert (tmp_path / "cli" / "generation_config.json").is_file()
    assert _digest(tmp_path / "cli") == _digest(write_checkpoint("tiny-llama", tmp_path / "api", seed=3))


@pytest.mark.slow
def test_real_size_checkpoint_streams_in_bounded_memory(tmp_path):
    """qwen3-0.6b in bf16 is ~1.2 GB on disk; writing it must not hold it all in RAM."""
    code = (
        "import resource, sys; from engine.checkpoint import write_checkpoint;"
        f"write_checkpoint('qwen3-0.6b', {str(tmp_path)!r});"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    peak_bytes = int(out.split()[-1]) * 1024  # ru_maxrss is in KiB on Linux
    size = (tmp_path / "model.safetensors").stat().st_size
    assert size == pytest.approx(2 * 0.596e9, rel=0.01)
    assert peak_bytes < size / 2
    assert set(PRESETS) >= {"qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-32b"}


def _interrupt_after(monkeypatch, files: int) -> None:
    """Make the weight writer raise once it has written `files` safetensors files, as Ctrl-C would."""
    import engine.checkpoint as checkpoint

    real, written = checkpoint._write_safetensors, []

    def write(path, *args):
        if len(written) == files:
            path.write_bytes(b"\0" * 100)  # the file it was part-way through
            raise KeyboardInterrupt
        real(path, *args)
        written.append(path)

    monkeypatch.setattr(checkpoint, "_write_safetensors", write)


@pytest.mark.parametrize("files", [0, 2])
def test_an_interrupted_write_leaves_no_folder_and_the_next_write_succeeds(tmp_path, monkeypatch, files):
    out = tmp_path / "ckpt"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, files)
        with pytest.raises(KeyboardInterrupt):
            write_checkpoint("tiny-qwen3", out, max_shard_bytes=50_000)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor the partial one
    write_checkpoint("tiny-qwen3", out, max_shard_bytes=50_000)
    again = write_checkpoint("tiny-qwen3", tmp_path / "b", max_shard_bytes=50_000)
    assert is_complete(out) and _digest(out) == _digest(again)


def test_an_interrupted_rewrite_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    before = _digest(write_checkpoint("tiny-llama", tmp_path / "ckpt", seed=1))
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 0)
        with pytest.raises(KeyboardInterrupt):
            write_checkpoint("tiny-llama", tmp_path / "ckpt", seed=2)
    assert _digest(tmp_path / "ckpt") == before and [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_killed_writers_partial_folder_is_removed_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    abandoned = tmp_path / f".ckpt.partial-{dead}-0123abcd"
    live = tmp_path / f".ckpt.partial-{1}-0123abcd"  # pid 1 is always alive: a writer still at work
    other = tmp_path / f".other.partial-{dead}-0123abcd"  # another checkpoint's
    for folder in (abandoned, live, other):
        (folder / "config.json").parent.mkdir()
        (folder / "config.json").write_text("{}")
    write_checkpoint("tiny-qwen3", tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", live.name, other.name])


def test_a_folder_that_is_not_a_checkpoint_is_refused_not_replaced(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="out_dir=.*neither an empty folder nor a checkpoint"):
        write_checkpoint("tiny-qwen3", tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "tiny-qwen3", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "neither an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_is_complete_spots_a_truncated_or_missing_shard(tmp_path):
    d = write_checkpoint("tiny-qwen2", tmp_path / "d", max_shard_bytes=50_000)
    assert is_complete(d)
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-1])
    assert not is_complete(d)
    shard.unlink()
    assert not is_complete(d) and not is_complete(tmp_path / "missing")
