"""Every config composes and converts; bad names and values fail with clear errors."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from engine.core import CacheConfig, SchedulerConfig
from engine.core.model_shapes import RENAMED
from harness.config import CONF_DIR, REPO_ROOT, build_run_config, moved_override
from harness.convert import ConfigError, to_dataclass
from harness.study import StudyConfig, build_study
from harness.sweeps.sweep import point_configs
from harness.workloads import WorkloadConfig
from sim.config import SimConfig
from sim.specs import HardwareSpec, ModelSpec
from tests.harness.conftest import compose_config

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def test_experiment_list_covers_the_issue():
    assert {"bench", "preemption", "prefix_cache", "chunked_prefill", "policy", "capacity"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_converts(name):
    cfg = compose_config([f"experiment={name}"])
    rc = build_run_config(cfg)
    study, output = build_study(cfg)
    assert isinstance(rc.scheduler, SchedulerConfig) and isinstance(rc.cache, CacheConfig)
    assert isinstance(rc.workload, WorkloadConfig) and isinstance(rc.model, ModelSpec)
    assert isinstance(rc.hardware, HardwareSpec)
    if study.kind == "compare":  # the engine first, then the simulator with its settings
        from harness.compare.study import CompareConfig
        from harness.config import section

        assert rc.backend == "engine" and isinstance(to_dataclass(CompareConfig, section(cfg, "compare"), "compare"),
                                                     CompareConfig)
    elif study.kind == "fidelity":  # the engine, then the simulator per cell
        from harness.config import section
        from harness.fidelity.study import FidelityConfig

        assert rc.backend == "engine" and isinstance(
            to_dataclass(FidelityConfig, section(cfg, "fidelity"), "fidelity"), FidelityConfig)
    else:
        assert isinstance(rc.sim, SimConfig)
    assert isinstance(study, StudyConfig) and study.name == name
    if study.param:
        # Every sweep point converts too (a bad value must fail before the first run).
        points = point_configs(cfg, study)
        assert [value for value, _ in points] == list(study.values)


# Options with a mandatory value (???) the user must give.
REQUIRED = {"trace": ["workload.trace_path=my_trace.csv"],
            "trace_lengths": ["workload.trace_path=my_trace.csv", "workload.rate=2"]}


@pytest.mark.parametrize("group", ["model", "hardware", "workload", "scheduler"])
def test_every_group_option_converts(group):
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        if group == "model" and path.stem in RENAMED:
            continue  # another spelling of a model, refused (tests/harness/test_model_names.py)
        rc = build_run_config(compose_config([f"{group}={path.stem}", *REQUIRED.get(path.stem, [])]))
        assert getattr(rc, group) is not None


def test_defaults_are_the_documented_ones():
    rc = build_run_config(compose_config([]))
    assert rc.backend == "sim" and rc.model.name == "qwen3-0.6b" and rc.hardware.name.startswith("H100")
    assert rc.workload.name == "bench" and rc.scheduler.policy == "nano"


def test_sweep_point_overrides_reach_the_dataclasses():
    cfg = compose_config(["experiment=preemption"])
    study, _ = build_study(cfg)
    blocks = [rc.cache.num_blocks for _, rc in point_configs(cfg, study)]
    assert blocks == list(study.values)


def test_sweep_point_keeps_the_other_overrides():
    cfg = compose_config(["scheduler.max_num_seqs=64", "study.kind=sweep", "study.param=workload.num_requests",
                          "study.values=[8]"])
    study, _ = build_study(cfg)
    [(value, rc)] = point_configs(cfg, study)
    assert value == 8 and rc.workload.num_requests == 8 and rc.scheduler.max_num_seqs == 64


def test_group_swap_in_a_sweep_loads_that_file():
    cfg = compose_config(["experiment=capacity"])
    study, _ = build_study(cfg)
    names = [rc.hardware.name for _, rc in point_configs(cfg, study)]
    assert len(set(names)) == len(study.values) == 3


def test_unknown_config_name_is_a_hydra_error():
    with pytest.raises(MissingConfigException, match="model/qwen9"):
        compose_config(["model=qwen9"])
    with pytest.raises(MissingConfigException, match="experiment/nope"):
        compose_config(["experiment=nope"])


def test_unknown_key_override_is_a_hydra_error():
    with pytest.raises(ConfigCompositionException, match="scheduler.foo"):
        compose_config(["scheduler.foo=1"])


@pytest.mark.parametrize("override, field", [
    ("scheduler.max_num_seqs=-1", "max_num_seqs"),
    ("scheduler.max_num_seqs=abc", "scheduler.max_num_seqs"),
    ("+scheduler.foo=1", "foo"),
    ("cache.block_size=0", "block_size"),
    ("workload.prompt_len.low=0", "workload.prompt_len"),
    ("workload.arrival=sometimes", "workload.arrival"),
    ("workload.oversize=truncate", "workload.oversize"),
    ("+model.num_layers=0", "num_layers"),
    ("backend.cost_model=magic", "cost_model"),
    ("execution.tensor_parallel_size=1.5", "execution.tensor_parallel_size"),
    ("execution.async_scheduling=on", "execution.async_scheduling"),
    ("execution.all_reduce=fast", "all_reduce"),
    ("execution.gpu_memory_utilization=1.5", "gpu_memory_utilization"),
    ("backend.profile_path=no/such/profile.csv", "backend.profile_path"),
])
def test_bad_value_is_one_config_error_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_run_config(compose_config([override]))


@pytest.mark.parametrize("backend", ["sim", "engine"])
@pytest.mark.parametrize("old, new", [("enforce_eager=true", "execution.enforce_eager"),
                                      ("tp_size=2", "execution.tensor_parallel_size"),
                                      ("max_cuda_graph_batch_size=64", "execution.max_graph_batch_size"),
                                      ("async_scheduling=on", "execution.async_scheduling"),
                                      ("all_reduce=symmetric", "execution.all_reduce")])
def test_a_backend_key_that_moved_to_execution_is_an_error_naming_the_new_key(backend, old, new):
    message = f"backend.{old.split('=')[0]} is not a backend setting: set {new}"
    assert moved_override([f"backend={backend}", f"backend.{old}"]) == message + " (shared by both backends)"
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        build_run_config(compose_config([f"backend={backend}", f"+backend.{old}"]))
    assert moved_override([f"backend={backend}", "execution.seed=3"]) is None


def test_one_execution_section_reaches_either_backend():
    overrides = ["execution.enforce_eager=true", "execution.seed=7", "execution.async_scheduling=false",
                 "execution.all_reduce=symmetric"]
    sim = build_run_config(compose_config(overrides)).sim.execution
    engine = build_run_config(compose_config(["backend=engine", *overrides])).engine.execution
    assert sim == engine and (sim.enforce_eager, sim.seed, sim.async_scheduling) == (True, 7, False)
    assert sim.all_reduce == "symmetric"


def test_engine_backend_defaults_to_the_model_presets_checkpoint():
    from harness.checkpoints import CHECKPOINT_ROOT

    rc = build_run_config(compose_config(["backend=engine", "model=qwen3-8b"]))
    assert rc.engine.model == str(CHECKPOINT_ROOT / "qwen3-8b")


def test_engine_backend_without_preset_needs_a_model_path():
    with pytest.raises(ConfigError, match=r"backend\.model.*no random-weight preset"):
        build_run_config(compose_config(["backend=engine", "+model.name=MyModel-7B"]))


def test_bad_study_settings_are_config_errors():
    with pytest.raises(ConfigError, match="study.kind"):
        build_study(compose_config(["study.kind=dance"]))
    with pytest.raises(ConfigError, match="study.param is only used by"):  # a single run would ignore it
        build_study(compose_config(["study.param=cache.num_blocks", "study.values=[64]"]))
    cfg = compose_config(["study.kind=sweep", "study.param=scheduler.nope", "study.values=[1]"])
    study, _ = build_study(cfg)
    with pytest.raises(ConfigError, match="scheduler.nope"):
        point_configs(cfg, study)


@dataclass(frozen=True)
class _Inner:
    size: int
    ratio: float = 0.5


@dataclass(frozen=True)
class _Outer:
    inner: _Inner
    names: tuple[str, ...] = ()
    limit: int | None = None


def test_converter_checks_names_types_and_nesting():
    out = to_dataclass(_Outer, {"inner": {"size": 3, "ratio": 1}, "names": ["a"], "limit": 8.0e3}, "x")
    assert out == _Outer(_Inner(3, 1.0), ("a",), 8000) and isinstance(out.inner.ratio, float)
    with pytest.raises(ConfigError, match=r"x\.inner: unknown field\(s\) \['sise'\]"):
        to_dataclass(_Outer, {"inner": {"sise": 3}}, "x")
    with pytest.raises(ConfigError, match=r"x\.inner: missing required field\(s\) \['size'\]"):
        to_dataclass(_Outer, {"inner": {}}, "x")
    with pytest.raises(ConfigError, match=r"x\.limit must be int or null"):
        to_dataclass(_Outer, {"inner": {"size": 1}, "limit": "many"}, "x")
    with pytest.raises(ConfigError, match=r"x\.inner\.size must be an int, got True"):
        to_dataclass(_Outer, {"inner": {"size": True}}, "x")


def _harness(args, cwd):
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_bad_value_prints_one_line_and_exits_2(tmp_path):
    result = _harness(["scheduler.max_num_seqs=-1"], tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: scheduler: SchedulerConfig.max_num_seqs must be a positive int, got -1"]
    assert "Traceback" not in result.stdout + result.stderr


def test_cli_unknown_group_option_names_the_options(tmp_path):
    result = _harness(["model=qwen9"], tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model must be one of [")
    assert "qwen9" in lines[0] and "qwen3-8b" in lines[0] and "tiny-qwen3" in lines[0]
    assert "Traceback" not in result.stderr
