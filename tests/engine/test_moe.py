"""Qwen3-MoE in the engine on CPU: the router and the grouped expert path against transformers and a
float32 per-token reference, both checkpoint layouts of the experts, tensor-parallel shards of
every expert, random weights without a checkpoint (load_format="dummy"), and the bad inputs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.layers.moe import MoEExperts
from engine.layers.parallel import TensorParallel
from engine.loader import CheckpointError, load_model
from kernels.moe_reference import fused_moe_ref, grouped_moe, route
from tests.engine.test_model_hf import PagedRun, assert_logits_close

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _experts_case(tokens: int, experts: int, top_k: int, seed: int, hidden: int = 48, inter: int = 40):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    weights, ids = route(torch.randn(tokens, experts, generator=gen), top_k, renormalize=seed % 2 == 0)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 4, 1), (7, 8, 2), (33, 16, 4), (64, 128, 8)])
def test_grouped_path_matches_per_token_reference(tokens, experts, top_k):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs each run; printed on failure
    case = _experts_case(tokens, experts, top_k, seed)
    torch.testing.assert_close(grouped_moe(*case), fused_moe_ref(*case), rtol=1e-5, atol=1e-5, msg=f"seed {seed}")


@pytest.mark.parametrize("renormalize", [True, False])
def test_router_matches_transformers(renormalize):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=renormalize)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(9, 32)
    _, want_weights, want_ids = router(x)
    weights, ids = route(torch.nn.functional.linear(x, router.weight), 4, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights)
    assert torch.allclose(weights.sum(-1), torch.ones(9)) == renormalize


def test_packed_expert_tensors_load_like_per_expert_ones(hf_qwen3_moe_dir, tmp_path):
    """transformers 5 holds experts stacked (mlp.experts.gate_up_proj [E, 2I, H]); a checkpoint saved
    from that state dict serves the same logits as the per-expert one save_pretrained writes."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_qwen3_moe_dir, dtype=torch.float32)
    state = hf.state_dict()
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    shutil.copy(hf_qwen3_moe_dir / "config.json", tmp_path / "config.json")
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = [5, 100, 7, 300, 42, 9]
    logits = [PagedRun(load_model(d, attention_backend="torch")[0]).step([("s", ids, 0)])[0]
              for d in (hf_qwen3_moe_dir, tmp_path)]
    assert_logits_close(logits[1], logits[0])


@pytest.mark.parametrize("tp_size", [2, 4])
def test_expert_shards_concatenate_to_the_full_expert(tp_size):
    gate, up, down = torch.randn(8, 6), torch.randn(8, 6), torch.randn(6, 8)
    gate_up_parts, down_parts = [], []
    for rank in range(tp_size):
        tp = TensorParallel(rank, tp_size, all_reduce=lambda x: x, all_gather=lambda x: x)
        experts = MoEExperts(3, 6, 8, tp)
        experts.load_gate_up(experts.gate_up_proj, gate, (2, 0))
        experts.load_gate_up(experts.gate_up_proj, up, (2, 1))
        experts.load_down(experts.down_proj, down, 2)
        gate_up_parts.append(experts.gate_up_proj[2].chunk(2))
        down_parts.append(experts.down_proj[2])
    assert torch.equal(torch.cat([g for g, _ in gate_up_parts]), gate)
    assert torch.equal(torch.cat([u for _, u in gate_up_parts]), up)
    assert torch.equal(torch.cat(down_parts, dim=1), down)


def test_checkpoint_missing_an_expert_tensor_is_named(tiny_qwen3_moe_dir, tmp_path):
    shutil.copytree(tiny_qwen3_moe_dir, tmp_path, dirs_exist_ok=True)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        load_model(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "lacks 1 tensor(s)" in message
    assert message.endswith("model.layers.2.mlp.experts.5.up_proj.weight")


def test_more_experts_per_token_than_experts_is_refused(tiny_qwen3_moe_dir, tmp_path):
    shutil.copytree(tiny_qwen3_moe_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(9\) must not exceed num_experts \(8\)"):
        LLM(tmp_path, device="cpu")


def test_dummy_weights_serve_a_preset_without_a_checkpoint():
    llm = LLM("tiny-qwen3-moe", load_format="dummy", device="cpu", max_model_len=64, block_size=4)
    model = llm.executor.runner.model
    assert llm.engine_config.load_format == "dummy"
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
    assert 0.015 < float(model.model.layers[1].mlp.experts.gate_up_proj.std()) < 0.025
    out = llm.generate([[1, 2, 3, 4, 5], "hello"], GREEDY, use_tqdm=False)
    assert all(len(o.token_ids) == 6 for o in out)


def test_dummy_weights_of_a_model_shape():
    from engine.core.model_shapes import MODEL_SHAPES

    llm = LLM(MODEL_SHAPES["tiny-qwen3"], load_format="dummy", device="cpu", max_model_len=64)
    assert len(llm.generate([[7, 8, 9]], GREEDY, use_tqdm=False)[0].token_ids) == 6
    with pytest.raises(ValueError, match="needs load_format='dummy'"):
        LLM(MODEL_SHAPES["tiny-qwen3"], device="cpu")


def test_dummy_without_a_shape_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^load_format='dummy': model 'no-such-model' has no shape; [^\n]*$"):
        LLM("no-such-model", load_format="dummy", device="cpu")
    with pytest.raises(ValueError, match="load_format must be one of"):
        LLM("tiny-qwen3-moe", load_format="random", device="cpu")


def test_harness_dummy_names_the_preset_and_refuses_a_model_without_one():
    from harness.convert import ConfigError
    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=engine", "model=qwen3-30b-a3b", "backend.load_format=dummy"])
    assert rc.engine.model == "qwen3-30b-a3b" and rc.engine.load_format == "dummy"
    with pytest.raises(ConfigError, match="no random-weight preset|would not have the overridden"):
        compose_run_config(["backend=engine", "model=tiny-qwen3-moe", "+model.num_layers=5",
                            "backend.load_format=dummy"])


@pytest.fixture(scope="module")
def sharp_moe_dir(hf_qwen3_moe_dir, tmp_path_factory):
    """The transformers-written checkpoint with every non-norm weight scaled by 20, so that greedy
    continuations wander over the vocabulary (tests/engine/test_llm_differential.py says why)."""
    out = tmp_path_factory.mktemp("sharp-qwen3-moe")
    shutil.copytree(hf_qwen3_moe_dir, out, dirs_exist_ok=True)
    for path in out.glob("*.safetensors"):
        weights = load_file(path)
        save_file({k: v if "norm" in k else (v * 20).contiguous() for k, v in weights.items()}, path,
                  metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("scenario", ["plain", "chunked", "prefix", "preempt"])
def test_greedy_generate_matches_transformers(sharp_moe_dir, scenario):
    from transformers import AutoModelForCausalLM

    from tests.engine.test_llm_differential import PREFIX_PROMPTS, PROMPTS, SCENARIOS

    hf = AutoModelForCausalLM.from_pretrained(sharp_moe_dir, dtype=torch.float32).eval()
    prompts = PREFIX_PROMPTS if scenario == "prefix" else PROMPTS
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(sharp_moe_dir, device="cpu", max_model_len=64, **SCENARIOS[scenario])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        want = hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                           attention_mask=torch.ones_like(ids))[0, len(prompt):].tolist()
        assert out.token_ids == want
    assert len({t for o in outputs for t in o.token_ids}) > 6  # not one token repeated
    if scenario == "prefix":
        assert llm.scheduler.block_manager.hits > 0
    elif scenario == "preempt":
        assert llm.scheduler.num_preemptions > 0
    elif scenario == "chunked":
        assert all(s.stats.num_prefill_tokens + s.stats.num_decode_tokens <= 8 for s in llm.last_run.steps)
