"""Whether the studies under a report's folders finished: harness.report names those that did not.

Two signs of an unfinished study:
- an INTERRUPTED marker (harness.run_folder), written when Ctrl-C or SIGTERM stopped a run; its
  folder keeps only complete runs;
- a Hydra multirun (its folder holds multirun.yaml) with fewer finished job folders than its swept
  overrides ask for: jobs never started, interrupted, or killed before writing their summary. The
  jobs asked for are the product of the swept values of hydra.overrides.task and
  hydra.sweeper.params; each job folder's .hydra/overrides.yaml says which one it is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from harness.run_folder import INTERRUPTED, RESULT_FILES, STAGING_PREFIX

COMPLETE, INTERRUPTED_STATUS, SWEEP_INCOMPLETE = "complete", "interrupted", "sweep incomplete"


def staging(path: Path) -> bool:
    """Whether path lies in a folder of files still being written (harness.run_folder.staged)."""
    return any(part.startswith(STAGING_PREFIX) for part in path.parts)


def interrupted_at(folder: Path) -> Path | None:
    """The folder (folder itself or one above it) marked INTERRUPTED, None when there is none."""
    for candidate in (folder, *folder.parents):
        if (candidate / INTERRUPTED).is_file():
            return candidate
    return None


@dataclass
class Multirun:
    """A Hydra multirun folder: the jobs its overrides ask for and what each job folder holds."""

    root: Path
    asked: list[tuple] | None  # one key per job: its swept (key, value) pairs; None: not countable
    complete: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # a folder without results or marker (killed)
    missing: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return not (self.interrupted or self.unfinished or self.missing)

    def describe(self) -> str:
        total = len(self.asked) if self.asked is not None else "?"
        parts = [f"{len(self.complete)} of {total} jobs complete"]
        for what, names in (("interrupted", self.interrupted), ("without results", self.unfinished),
                            ("never written", self.missing)):
            if names:
                parts.append(f"{len(names)} {what} ({', '.join(names)})")
        return f"{self.root}: Hydra multirun: " + "; ".join(parts)


def _override_pairs(lines: list[str], swept: set[str]) -> tuple:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(lines)
    return tuple(sorted((o.key_or_group, str(o.value())) for o in parsed if o.key_or_group in swept))


def asked_jobs(multirun_yaml: Path) -> tuple[set[str], list[tuple] | None]:
    """(swept keys, one (key, value) tuple per job asked for), or None for sweeps that cannot be
    counted here (glob, interval)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    hydra = OmegaConf.load(multirun_yaml).get("hydra", {})
    lines = list(OmegaConf.to_container(hydra.get("overrides", {}).get("task", []) or []))
    params = hydra.get("sweeper", {}).get("params") or {}
    lines += [f"{key}={value}" for key, value in params.items()]
    parser = OverridesParser.create()
    choices = []
    for override in parser.parse_overrides(lines):
        if not override.is_sweep_override():
            continue
        try:
            values = list(override.sweep_string_iterator())
        except HydraException:  # glob or interval sweeps: not a list of values
            return set(), None
        choices.append([f"{override.key_or_group}={v}" for v in values])
    swept = {c[0].split("=", 1)[0] for c in choices}
    return swept, [_override_pairs(list(combo), swept) for combo in itertools.product(*choices)]


def multirun_status(root: Path) -> Multirun:
    from omegaconf import OmegaConf

    swept, asked = asked_jobs(root / "multirun.yaml")
    run = Multirun(root, asked)
    found = set()
    for job in sorted(p for p in root.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()):
        found.add(_override_pairs(list(OmegaConf.load(job / ".hydra" / "overrides.yaml")), swept))
        if (job / INTERRUPTED).is_file():
            run.interrupted.append(job.name)
        elif any(next(job.rglob(name), None) for name in RESULT_FILES):
            run.complete.append(job.name)
        else:
            run.unfinished.append(job.name)
    if asked is not None:
        run.missing = [",".join(f"{k}={v}" for k, v in key) or "(job)" for key in asked if key not in found]
    return run


def unfinished_studies(dirs: list[Path]) -> list[str]:
    """One line per study under dirs that did not finish."""
    lines, multirun_roots = [], set()
    for root in dirs:
        for yaml in sorted(root.rglob("multirun.yaml")):
            run = multirun_status(yaml.parent)
            multirun_roots.add(yaml.parent.resolve())
            if not run.finished:
                lines.append(run.describe())
        for marker in sorted(root.rglob(INTERRUPTED)):
            if marker.parent.parent.resolve() in multirun_roots:
                continue  # a multirun's job: its multirun's line names it
            text = marker.read_text().splitlines()
            lines.append(f"{marker.parent}: {text[0] if text else 'interrupted'}; "
                         + "; ".join(line for line in text[1:3]))
    return lines


def run_status(folder: Path, unfinished_multiruns: set[Path]) -> str:
    """complete, interrupted (its folder or a folder above is marked), or sweep incomplete (a
    complete job of a multirun that did not finish)."""
    if interrupted_at(folder) is not None:
        return INTERRUPTED_STATUS
    resolved = folder.resolve()
    if any(root in resolved.parents or root == resolved for root in unfinished_multiruns):
        return SWEEP_INCOMPLETE
    return COMPLETE


def unfinished_multirun_roots(dirs: list[Path]) -> set[Path]:
    return {yaml.parent.resolve() for root in dirs for yaml in root.rglob("multirun.yaml")
            if not multirun_status(yaml.parent).finished}
