"""fleet=disaggregated through the harness: its tables, and bad input in one line."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.study import run_study
from tests.harness.conftest import compose_config

SMALL = ["fleet=disaggregated", "workload=poisson", "workload.num_requests=40", "workload.rate=20",
         "workload.prompt_len.high=400", "workload.output_len.high=100", "output.plots=false"]


def test_a_disaggregated_run_writes_the_transfer_columns(tmp_path):
    run_study(compose_config([*SMALL, "fleet.decode_replicas=2"]), tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert len(requests) == 40 and set(requests["prefill_replica"]) == {0}
    moved = requests[requests["output_tokens"] > 1]
    assert set(moved["decode_replica"]) == {0, 1}
    assert (moved["transfer_s"] > 0).all() and (moved["transfer_bytes"] > 0).all()
    # TTFT is the prefill replica's: queueing then prefill; the transfer comes after the first token
    assert (requests["ttft"] - requests["queue_s"] - requests["prefill_s"]).abs().max() < 1e-9
    assert (moved["transfer_start"] >= moved["first_token"]).all()
    # qwen3-0.6b: 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 114,688 bytes a token
    assert (moved["transfer_bytes"] == moved["prompt_tokens"] * 114_688).all()
    assert summary["transfer_p50_s"] <= summary["transfer_p90_s"] <= summary["transfer_p99_s"]
    assert summary["prefill_replicas"] == 1 and summary["decode_replicas"] == 2


def test_the_network_is_slower_than_nvlink(tmp_path):
    p50 = {}
    for link in ("nvlink", "network"):
        out = tmp_path / link
        run_study(compose_config([*SMALL, f"fleet.transfer.link={link}"]), out)
        p50[link] = pd.read_csv(out / "summary.csv")["transfer_p50_s"].iloc[0]
    assert p50["network"] > 5 * p50["nvlink"]  # 50 GB/s against 450 GB/s each way


@pytest.mark.parametrize("override, message", [
    ("fleet.prefill_replicas=0", r"fleet.prefill_replicas must be an int >= 1"),
    ("fleet.decode_replicas=0", r"fleet.decode_replicas must be an int >= 1"),
    ("fleet.decode.tp_size=16", r"fleet.decode.tp_size: TP size 16 exceeds the 8 GPUs of one H100-SXM5-80GB node"),
    ("fleet.prefill.hardware=a100", r"fleet.transfer.link=nvlink joins one GPU type"),
    ("fleet.decode_replicas=9", r"the fleet's 10 GPUs exceed one node's 8: use fleet.transfer.link=network"),
    ("cache.num_blocks=1", r"fleet.decode: a decode replica's KV cache holds 1 blocks"),
    ("fleet.transfer.link=pcie", r"fleet.transfer.link must be one of \['nvlink', 'network'\]"),
    ("fleet.decode_router=random", r"fleet.decode_router must be one of"),
])
def test_bad_disaggregated_input_is_one_line_naming_the_field(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config([*SMALL, override]), tmp_path)
    assert "\n" not in str(error.value)


def test_pools_may_differ_in_gpu_type_over_the_network(tmp_path):
    run_study(compose_config([*SMALL, "fleet.prefill.hardware=h200", "fleet.decode.hardware=a100",
                              "fleet.transfer.link=network"]), tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert summary["hardware"] == "H200-SXM-141GB / A100-SXM4-80GB"


def test_an_engine_fleet_on_cpu_moves_kv_and_times_the_transfers(tmp_path, tiny_checkpoint):
    run_study(compose_config(["backend=engine", f"backend.model={tiny_checkpoint}", "backend.device=cpu",
                              "model=tiny-qwen3", "fleet=disaggregated", "workload.num_requests=6",
                              "workload.prompt_len.high=120", "workload.output_len.low=2",
                              "workload.output_len.high=12", "scheduler.max_model_len=256", "output.plots=false"]),
              tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 6 and (requests["decode_replica"] == 0).all()
    assert (requests["transfer_s"] > 0).all() and (requests["transfer_bytes"] > 0).all()
    assert pd.read_csv(tmp_path / "summary.csv")["transfer_p50_s"].iloc[0] > 0


@pytest.mark.slow
def test_an_engine_fleet_of_two_tp_sizes_moves_the_whole_kv_of_each_request(tmp_path, tiny_checkpoint):
    """Prefill TP 1, decode TP 2 (3 processes on gloo): the KV heads are regrouped on the link and
    transfer_bytes counts both of tiny-qwen3's heads, as the simulated fleet's does."""
    run_study(compose_config(["backend=engine", f"backend.model={tiny_checkpoint}", "backend.device=cpu",
                              "model=tiny-qwen3", "fleet=disaggregated", "fleet.decode.tp_size=2",
                              "workload.num_requests=4", "workload.prompt_len.high=100", "workload.output_len.low=2",
                              "workload.output_len.high=8", "scheduler.max_model_len=256", "output.plots=false"]),
              tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert len(requests) == 4 and (requests["decode_replica"] == 0).all()
    # whole blocks (256 tokens, conf/config.yaml) of 2 layers x K/V x 2 KV heads x head_dim 16 x 4 bytes a token
    blocks = -(-requests["prompt_tokens"] // 256)
    assert (requests["transfer_bytes"] == blocks * 256 * 2 * 2 * 2 * 16 * 4).all()
    assert summary["gpus"] == 3


def test_an_engine_fleet_with_a_tp_size_that_does_not_split_the_heads_is_one_line(tmp_path, tiny_checkpoint):
    with pytest.raises(ConfigError, match=r"fleet.decode.tp_size: TP size 3 does not divide model.num_heads") as error:
        run_study(compose_config(["backend=engine", f"backend.model={tiny_checkpoint}", "backend.device=cpu",
                                  "model=tiny-qwen3", "fleet=disaggregated", "fleet.decode.tp_size=3"]), tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("setting", "message"), [
    ("fleet.transfer.layerwise=true", r"^fleet.transfer.layerwise=True prices a simulated fleet's KV transfer"),
    ("fleet.transfer.bandwidth=2e11", r"^fleet.transfer.bandwidth=200000000000.0 prices a simulated"),
    ("fleet.transfer.handshake=true", r"^fleet.transfer.handshake=True prices a simulated"),
    ("fleet.decode.hardware=a100", r"^fleet.decode.hardware='a100': backend=engine serves on this machine's GPUs")])
def test_an_engine_fleet_refuses_the_settings_only_a_simulated_fleet_reads(tmp_path, tiny_checkpoint, setting, message):
    """Refused before any replica starts: the engine would serve as if they were not set."""
    overrides = ["backend=engine", f"backend.model={tiny_checkpoint}", "backend.device=cpu", "model=tiny-qwen3",
                 "fleet=disaggregated", "fleet.transfer.link=network", setting]
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(overrides), tmp_path)
    assert "\n" not in str(error.value) and not (tmp_path / "summary.csv").exists()


@pytest.mark.parametrize("extra", [[], ["workload.rate_profile=[[0,5]]", "workload.duration_s=2", "workload.rate=null",
                                        "workload.num_requests=null",
                                        "fleet.decode.autoscale={policy: queue, max_replicas: 2}"]])
def test_a_pool_its_memory_plan_does_not_fit_is_one_line_naming_the_pool(tmp_path, extra):
    # a KV link staging sized for 400k-token prompts leaves no room for the cache
    overrides = [*SMALL, "model=qwen3-8b", "scheduler.max_model_len=400000", *extra]
    with pytest.raises(ConfigError, match=r"^backend=sim: fleet.prefill: qwen3-8b does not fit on H100") as error:
        run_study(compose_config(overrides), tmp_path)
    assert "\n" not in str(error.value)


def _ttft_p50(overrides: list[str], out) -> float:
    run_study(compose_config(overrides), out)
    return float(pd.read_csv(out / "summary.csv")["ttft_p50_s"].iloc[0])


def test_a_pool_priced_at_its_own_host_moves_only_its_own_steps(tmp_path):
    # prompts past the 4,096-token prefill graphs: eager prefills, whose launches set their time
    long_prompts = ["fleet=disaggregated", "workload=poisson", "workload.num_requests=12", "workload.rate=2",
                    "workload.prompt_len.low=5000", "workload.prompt_len.high=6000",
                    "workload.output_len.low=10", "workload.output_len.high=20",
                    "scheduler.max_model_len=8192", "hardware=h200", "backend.cost_model=profiled",
                    "output.plots=false"]
    base = _ttft_p50(long_prompts, tmp_path / "base")
    slow_prefill = _ttft_p50([*long_prompts, "fleet.prefill.host_scale=1.6"], tmp_path / "prefill")
    slow_decode = _ttft_p50([*long_prompts, "fleet.decode.host_scale=1.6"], tmp_path / "decode")
    assert slow_prefill > 1.2 * base  # launch-bound steps at 1.6x the launches
    assert slow_decode == base  # the first token is the prefill replica's


@pytest.mark.parametrize("extra, message", [
    (["fleet.prefill.host_scale=0"], r"fleet.prefill.host_scale must be a number > 0"),
    (["fleet.decode.host_scale=1.5"], r"fleet.decode.host_scale prices a profiled model's host parts: it needs "
                                      r"backend=sim backend.cost_model=profiled"),
])
def test_a_pool_host_scale_the_run_cannot_price_is_one_line(extra, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config([*SMALL, *extra]), tmp_path)
    assert "\n" not in str(error.value)


def test_the_printed_ttft_split_adds_up_to_the_printed_ttft(tmp_path, capsys):
    """The log's TTFT = queue + prefill line is a sum a reader can check: means add up, P90s do not."""
    run_study(compose_config([*SMALL, "workload.rate=80"]), tmp_path)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("TTFT = queue + prefill"))
    queue, prefill, ttft = map(float, re.search(r"mean ([0-9.]+) s \+ ([0-9.]+) s = ([0-9.]+) s", line).groups())
    assert queue + prefill == pytest.approx(ttft, abs=2e-4)
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert ttft == pytest.approx(summary["ttft_mean_s"], abs=1e-4) and queue > 0
