"""The model description's mixture-of-experts fields: which layers route to experts, and the
refusals a config that cannot be served gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.model_shapes import ModelShape

BASE = dict(name="m", hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=512)


def moe(**fields) -> ModelShape:
    return ModelShape(**{**BASE, "num_layers": 4, "model_type": "qwen3_moe", "num_experts": 8,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 32, **fields})


@given(layers=st.integers(1, 12), step=st.integers(1, 4), data=st.data())
def test_a_layer_routes_to_experts_by_the_sparse_step_unless_it_is_mlp_only(layers, step, data):
    dense = data.draw(st.lists(st.integers(0, layers - 1), unique=True, max_size=layers))
    shape = moe(num_layers=layers, decoder_sparse_step=step, mlp_only_layers=tuple(dense))
    expected = [(i + 1) % step == 0 and i not in dense for i in range(layers)]
    assert [shape.is_moe_layer(i) for i in range(layers)] == expected
    assert shape.num_moe_layers == sum(expected)


def test_a_dense_model_has_no_expert_layers():
    shape = ModelShape(**BASE, num_layers=3)
    assert not shape.is_moe and shape.num_moe_layers == 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must not exceed num_experts \(8\)"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size must be > 0"),
    ({"mlp_only_layers": (4,)}, r"mlp_only_layers \[4\] are not layers of a 4-layer model"),
    ({"model_type": "qwen3"}, "a qwen3 model has no experts"),
    ({"num_experts": -1}, "num_experts must be an int >= 0"),
])
def test_a_config_that_cannot_be_served_is_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        moe(**fields)


def test_a_yaml_list_of_dense_layers_becomes_a_tuple():
    assert moe(mlp_only_layers=[0, 2]).mlp_only_layers == (0, 2)


def test_from_hf_config_reads_the_expert_keys_of_a_qwen3_moe_config():
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 2,
              "mlp_only_layers": [0], "norm_topk_prob": False}
    shape = ModelShape.from_hf_config(config)
    assert (shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size) == (8, 2, 32)
    assert shape.mlp_only_layers == (0,) and not shape.norm_topk_prob
    assert [shape.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    dense = ModelShape.from_hf_config({**config, "model_type": "qwen3"})  # a dense family ignores them
    assert not dense.is_moe
