"""The command line of `python -m harness`, checked before Hydra sees it.

Hydra refuses a config group option that does not exist (`hardware=h300`) or a key that is not in
the config (`scheduler.max_num_seq=4`) with its search path over many lines and exit status 1.
check_arguments finds those mistakes first and says each in one line naming the group or key and
what it may be, for `+group=`, `++group=` and multirun (`-m group=a,b`) lists alike.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from harness.config import moved_override
from harness.paths import CONF_DIR

MULTIRUN_FLAGS = ("-m", "--multirun")
# Each entry point's primary config in conf/, and the command that composes it.
ENTRY_POINTS = {"config": "python -m harness", "serving": "python -m harness.serve"}


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The options of a config group: its conf/<group>/*.yaml files, less the other spellings of a
    model name that exist only to be refused with the right name."""
    from engine.core.model_shapes import RENAMED

    names = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
    return [n for n in names if not (group == "model" and n in RENAMED)]


@cache
def config_groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """The groups of conf/: its folders holding YAML files (Hydra's own, under hydra/, excluded)."""
    return frozenset(p.name for p in conf_dir.iterdir()
                     if p.is_dir() and p.name != "hydra" and any(p.glob("*.yaml")))


@cache
def run_groups(conf_dir: Path = CONF_DIR, config_name: str = "config") -> frozenset[str]:
    """The groups a primary config's defaults list composes, with those of the primary configs it
    includes by name (serving.yaml includes config.yaml): what its entry point takes as group=name."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(conf_dir / f"{config_name}.yaml")).get("defaults", [])
    groups = {key for entry in defaults if isinstance(entry, dict) for key in entry}
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_":
            groups |= run_groups(conf_dir, entry)
    return frozenset(groups) & config_groups(conf_dir)


def check_arguments(argv: list[str], conf_dir: Path = CONF_DIR, config_name: str = "config") -> str | None:
    """The one-line error for a command line Hydra would refuse at length, None when it is fine
    (or when it uses Hydra's own flags, which Hydra checks). config_name: the entry point's primary
    config (`serving` for python -m harness.serve)."""
    if any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in argv):
        return None  # --cfg, --help, -cn, ...: Hydra's flags, Hydra's messages
    overrides = [a for a in argv if a not in MULTIRUN_FLAGS]
    if (moved := moved_override(overrides)) is not None:
        return moved
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as error:
        return f"cannot read the override: {str(error).splitlines()[0]}"
    parsed = [o for o in parsed if not o.key_or_group.startswith("hydra")]
    for override in parsed:
        if (problem := _check_group(override, conf_dir, config_name)) is not None:
            return problem
    if any("." in o.key_or_group for o in parsed):
        return _check_keys(parsed, conf_dir, config_name)
    return None


def _values(override) -> list[str] | None:
    """The values an override gives (each one of a multirun list), None for a glob or other sweep."""
    if override.is_delete():
        return []
    if not override.is_sweep_override():
        # as typed: Hydra reads `0.` as the float 0.0, but the user looks for what they wrote
        return [override.input_line.split("=", 1)[1]]
    from hydra.errors import HydraException

    try:
        return list(override.sweep_string_iterator())
    except HydraException:  # glob(...) and interval sweeps: Hydra expands them against what exists
        return None


def _check_group(override, conf_dir: Path, config_name: str) -> str | None:
    group = override.key_or_group
    if group not in config_groups(conf_dir):
        return None
    ours = run_groups(conf_dir, config_name)
    if group not in ours and not override.is_add():
        entry = next((command for name, command in ENTRY_POINTS.items() if group in run_groups(conf_dir, name)),
                     "another entry point")
        return (f"{group} is a config group of {entry}, not of {ENTRY_POINTS.get(config_name, config_name)} "
                f"(its groups: {', '.join(sorted(ours))})")
    options = group_options(group, conf_dir)
    for value in _values(override) or []:
        exists = (conf_dir / group / f"{value}.yaml").is_file()  # another spelling: refused later, by name
        if not exists:
            return f"{group} must be one of [{', '.join(options)}], got {value!r} (conf/{group}/)"
    return None


def _first_value(override) -> str:
    """The override as one composition takes it: a multirun list's first value."""
    if not override.is_sweep_override():
        return override.input_line
    values = _values(override)
    prefix = override.input_line[: len(override.input_line) - len(override.input_line.lstrip("+~"))]
    return f"{prefix}{override.key_or_group}={values[0]}" if values else ""


def _sets_under(line: str, key: str) -> bool:
    """Whether the override line sets key or a key inside it."""
    target = line.lstrip("+~").split("=", 1)[0]
    return target == key or target.startswith(f"{key}.")


def _check_keys(parsed: list, conf_dir: Path, config_name: str) -> str | None:
    """Compose the config once with the overrides (a multirun list: its first value) and turn
    Hydra's refusal of a key into one line."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    overrides = [line for line in map(_first_value, parsed) if line]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        try:
            compose(config_name=config_name, overrides=overrides)
            return None
        except (HydraException, ValueError) as error:
            cause = error.__cause__
            key = getattr(cause, "full_key", None)
            culprit = next((line for line in overrides if key and _sets_under(line, key)), None)
            if culprit is None:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                return first + (f" ({str(cause).splitlines()[0]})" if cause is not None else "")
            parent = key.rpartition(".")[0]
            base = compose(config_name=config_name, overrides=[line for line in overrides if line != culprit])
            node = OmegaConf.select(base, parent) if parent else base
            keys = ", ".join(sorted(str(k) for k in node)) if OmegaConf.is_dict(node) else ""
            where = f"{parent} has" if parent else "the config has"
            line = culprit.lstrip("+~")
            # usually the key of an option not chosen (fleet=disaggregated's pools): name that option
            setters = (_options_setting(line.split("=", 1)[0], conf_dir, config_name)
                       or _options_setting(key, conf_dir, config_name))
            where_else = f"{' or '.join(setters)} {'has' if len(setters) == 1 else 'have'} it; " if setters else ""
            return f"{key} is not a config key ({where} [{keys}]); {where_else}to add a key anyway, write +{line}"


def _options_setting(key: str, conf_dir: Path, config_name: str) -> list[str]:
    """The group=option choices of the entry point whose file sets key (fleet=disaggregated sets
    fleet.prefill_replicas; experiment=plan, a global package, sets plan.hardware)."""
    from omegaconf import OmegaConf

    found = []
    for group in sorted(run_groups(conf_dir, config_name)):
        for name in group_options(group, conf_dir):
            path = conf_dir / group / f"{name}.yaml"
            tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            if _has_key(tree if _is_global_package(path) else {group: tree}, key.split(".")):
                found.append(f"{group}={name}")
    return found


def _has_key(tree: object, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _is_global_package(path: Path) -> bool:
    """Whether the file's header comments declare `# @package _global_` (its keys sit at the root)."""
    with path.open() as lines:
        for line in lines:
            if not line.startswith("#"):
                return False
            if line.split() == ["#", "@package", "_global_"]:
                return True
    return False
