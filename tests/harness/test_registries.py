"""Names configs accept come from the registries: the conf/ files name exactly registered entries,
and a wrong name is refused in one line that lists the choices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from engine.attention.registry import ATTENTION_BACKENDS
from engine.core.routers import ROUTER_REGISTRY, ROUTERS, RouterConfig
from harness.backends import BACKENDS
from harness.config import CONF_DIR, build_run_config
from harness.convert import ConfigError
from harness.fleet.config import build_fleet
from harness.study import STUDIES, StudyConfig, build_study
from sim.config import SimConfig
from sim.cost_model import COST_MODELS
from tests.harness.conftest import compose_config


def group_names(group: str) -> dict[str, str]:
    """{file stem: the `name` it sets} over conf/<group>/*.yaml."""
    return {path.stem: OmegaConf.load(path).name for path in sorted((CONF_DIR / group).glob("*.yaml"))}


@pytest.mark.parametrize("group, names", [("router", ROUTERS), ("backend", BACKENDS.names())])
def test_each_registered_entry_has_one_conf_file_named_after_it(group, names):
    files = group_names(group)
    assert all(stem == name for stem, name in files.items()), files
    assert sorted(files) == sorted(names)


def experiment_configs() -> dict[str, object]:
    paths = [CONF_DIR / "config.yaml", *sorted((CONF_DIR / "experiment").glob("*.yaml"))]
    return {path.stem: OmegaConf.load(path) for path in paths}


def test_the_study_kinds_conf_names_are_exactly_the_registered_studies():
    kinds = {stem: conf.study.kind for stem, conf in experiment_configs().items() if "study" in conf}
    assert set(kinds.values()) == set(STUDIES.names()), kinds


def test_the_names_conf_files_pick_are_registered():
    assert OmegaConf.load(CONF_DIR / "backend" / "sim.yaml").cost_model in COST_MODELS
    assert OmegaConf.load(CONF_DIR / "backend" / "engine.yaml").attention_backend in ATTENTION_BACKENDS
    for stem, conf in experiment_configs().items():
        for section in ("compare", "fidelity"):
            if section in conf and "cost_models" in conf[section]:
                assert set(conf[section].cost_models) <= set(COST_MODELS.names()), stem
        if "plan" in conf and "routers" in conf.plan:
            assert set(conf.plan.routers) <= set(ROUTERS), stem


def build_all(overrides: list[str]) -> None:
    cfg = compose_config(overrides)
    build_run_config(cfg)
    build_fleet(cfg)
    build_study(cfg)


@pytest.mark.parametrize("overrides, field, names", [
    (["router.name=bogus"], "router.name", ROUTERS),
    (["backend.name=bogus"], "backend.name", BACKENDS.names()),
    (["backend.cost_model=bogus"], "backend.cost_model", COST_MODELS.names()),
    (["study.kind=bogus"], "study.kind", STUDIES.names()),
    (["backend=engine", "backend.attention_backend=bogus"], "attention_backend", ATTENTION_BACKENDS),
])
def test_a_wrong_name_is_refused_in_one_line_listing_the_registered_ones(overrides, field, names):
    with pytest.raises(ConfigError) as error:
        build_all(overrides)
    message = str(error.value)
    assert "\n" not in message
    assert field in message and "'bogus'" in message
    assert all(repr(name) in message for name in names), message


BUILDERS = {
    "router.name": lambda name: RouterConfig(name=name),
    "backend.cost_model": lambda name: SimConfig(cost_model=name, profile_path="steps.csv"),
    "study.kind": lambda name: StudyConfig(kind=name),
}


@pytest.mark.parametrize("registry", [ROUTER_REGISTRY, COST_MODELS, STUDIES], ids=lambda r: r.field)
@given(name=st.text(max_size=12))
def test_a_config_refuses_any_name_its_registry_lacks(registry, name):
    if name in registry:
        return
    with pytest.raises(ValueError, match=f"{registry.field} must be one of"):
        BUILDERS[registry.field](name)
