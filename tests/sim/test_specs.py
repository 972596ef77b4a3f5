from __future__ import annotations

import pytest

from sim.specs import HardwareSpec, ModelSpec
from tests.sim.helpers import hardware, model

QWEN3_8B_HF = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
    "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
}


def test_from_hf_config_reads_qwen3_shape():
    spec = ModelSpec.from_hf_config(QWEN3_8B_HF, name="qwen3-8b")
    assert spec == model("qwen3-8b")


def test_from_hf_config_defaults_head_dim_and_kv_heads_and_reads_dtype_key():
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8,
             "intermediate_size": 128, "vocab_size": 512, "dtype": "float32"}
    spec = ModelSpec.from_hf_config(llama, name="l")
    assert (spec.head_dim, spec.num_kv_heads, spec.dtype_bytes, spec.tie_word_embeddings) == (8, 8, 4, False)


def test_from_hf_config_rejects_incomplete_config():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelSpec.from_hf_config({"hidden_size": 64})


@pytest.mark.parametrize("name, total, non_embedding", [
    # Qwen's model cards: 0.6B (0.44B non-embedding), 8.2B (6.95B), 32.8B (31.2B)
    ("qwen3-0.6b", 0.6e9, 0.44e9), ("qwen3-8b", 8.2e9, 6.95e9), ("qwen3-32b", 32.8e9, 31.2e9),
])
def test_parameter_counts_match_published_sizes(name, total, non_embedding):
    spec = model(name)
    embeddings = spec.vocab_size * spec.hidden_size * (1 if spec.tie_word_embeddings else 2)
    assert spec.num_params == pytest.approx(total, rel=0.01)
    assert spec.num_params - embeddings == pytest.approx(non_embedding, rel=0.01)
    assert spec.weight_bytes == 2 * spec.num_params


def test_kv_bytes_per_token_and_tensor_parallel_shares():
    spec = model("qwen3-8b")
    assert spec.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert spec.kv_bytes_per_token_per_rank(2) == spec.kv_bytes_per_token // 2
    # 16 ranks > 8 KV heads: each rank keeps one (replicated) head
    assert spec.kv_bytes_per_token_per_rank(16) == spec.kv_bytes_per_token // 8
    embed = spec.vocab_size * spec.hidden_size
    # everything but the norms is split in two
    assert spec.num_params_per_rank(2) == pytest.approx(spec.num_params / 2, rel=1e-4)
    assert spec.num_params_per_rank(2) > spec.num_params / 2
    assert spec.lm_head_params(2) == embed // 2


@pytest.mark.parametrize("tp", [3, 0])
def test_check_tp_rejects_uneven_or_nonpositive_sharding(tp):
    with pytest.raises(ValueError, match="tp_size"):
        model("qwen3-8b").check_tp(tp)


def test_model_spec_validates_fields():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec("m", 2, 64, 4, 3, 16, 128, 512)
    with pytest.raises(TypeError, match="hidden_size"):
        ModelSpec("m", 2, 64.0, 4, 2, 16, 128, 512)
    with pytest.raises(ValueError, match=r"ModelSpec\.dtype must be one of \['bfloat16'"):
        ModelSpec("m", 2, 64, 4, 2, 16, 128, 512, dtype="int3")
    with pytest.raises(ValueError, match="ModelSpec.kv_cache_dtype must be one of"):
        ModelSpec("m", 2, 64, 4, 2, 16, 128, 512, kv_cache_dtype="int3")
    assert ModelSpec("m", 2, 64, 4, 2, 16, 128, 512, dtype="float8_e4m3fn").dtype_bytes == 1


def test_hardware_spec_validates_efficiencies_and_coerces_numbers():
    base = hardware("h100")
    with pytest.raises(ValueError, match="matmul_efficiency"):
        HardwareSpec("x", 1e12, 1e11, 2**30, 1e10, matmul_efficiency=1.5)
    with pytest.raises(TypeError, match="peak_flops"):
        HardwareSpec("x", "989e12", 1e11, 2**30, 1e10)
    with pytest.raises(ValueError, match="step_overhead_s"):
        HardwareSpec("x", 1e12, 1e11, 2**30, 1e10, step_overhead_s=-1.0)
    spec = HardwareSpec("x", 10**12, 10**11, 80.0e9, 10**10)
    assert isinstance(spec.peak_flops, float) and spec.mem_bytes == 80_000_000_000
    assert 0 < base.matmul_efficiency <= 1
