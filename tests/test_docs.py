"""The guide and docs/ stay true to the tree: links resolve, the outputs reference lists the
columns a run really writes, the architecture map names files that exist, and its seam snippet runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def _links(page: Path) -> list[str]:
    return LINK.findall(CODE_BLOCK.sub("", page.read_text()))


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", CODE_BLOCK.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_docs_exist_and_the_readme_links_each():
    names = {page.name for page in DOCS}
    assert {"architecture.md", "extending.md", "outputs.md", "results.md"} <= names
    linked = {Path(target.split("#")[0]).name for target in _links(REPO / "README.md")}
    assert names <= linked, f"docs the README does not link: {names - linked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target} does not resolve"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: no heading #{anchor} in {path or page.name}"


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [gone](missing.md) `[not a link](in code)`\n```\n[x](y.md)\n```\n")
    assert _links(page) == ["page.md#title", "missing.md"]
    assert "title" in _anchors(page)


def test_the_readme_is_a_guide_under_200_lines():
    assert len((REPO / "README.md").read_text().splitlines()) < 200


def _section_columns(text: str, heading: str) -> list[str]:
    """The `name` cells of the tables under a heading (up to the next heading of any level)."""
    body = re.split(rf"^#+ {re.escape(heading)}\s*$", text, flags=re.M)[1]
    body = re.split(r"^#", body, flags=re.M)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", body, re.M)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The headers a small simulated run writes: single and a fleet of two."""
    out = tmp_path_factory.mktemp("runs")
    common = ["workload=poisson", "workload.rate=20", "workload.num_requests=8", "output.progress=false",
              "output.plots=false"]
    runs = {"single": [], "fleet": ["fleet.replicas=2"], "autoscale": ["autoscale.policy=queue"],
            "disagg": ["fleet=disaggregated"]}
    # side by side: each run is a process of its own, mostly Python's start and imports
    started = {name: subprocess.Popen([sys.executable, "-m", "harness", *common, *extra, f"hydra.run.dir={out / name}"],
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for name, extra in runs.items()}
    for name, process in started.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}: {err[-3000:]}"
    files = {name: ("requests.csv", "steps.csv.gz", "summary.csv") for name in runs}
    files["autoscale"] += AUTOSCALE_FILES
    return {name: {f: list(pd.read_csv(out / name / f, nrows=0).columns) for f in files[name]} for name in runs}


def test_the_outputs_reference_lists_exactly_the_columns_a_run_writes(written):
    text = (REPO / "docs" / "outputs.md").read_text()
    for file in ("requests.csv", "steps.csv.gz", "summary.csv"):
        documented = _section_columns(text, file)
        assert len(documented) == len(set(documented)), f"{file}: a column is listed twice"
        assert documented == written["single"][file], f"docs/outputs.md, {file}: listed {documented}"
    fleet = _section_columns(text, "Fleet summary columns")
    assert set(written["fleet"]["summary.csv"]) == set(written["single"]["summary.csv"]) | set(fleet)
    for file in ("requests.csv", "steps.csv.gz"):  # a fleet adds `replica`, which the reference says
        assert written["fleet"][file] == [*written["single"][file], "replica"]
    assert "`replica`" in text


def test_the_outputs_reference_lists_the_columns_a_disaggregated_fleet_adds(written):
    text = (REPO / "docs" / "outputs.md").read_text()
    parts = re.split(r"^### Disaggregated fleet columns.*$", text, flags=re.M)
    assert len(parts) == 2, "docs/outputs.md: no section '### Disaggregated fleet columns'"
    body = parts[1].split("\n#")[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| `([a-z._]+)` \|", body, re.M)
    added = {file: [name for name, f in rows if f == file] for file in ("requests.csv", "steps.csv.gz", "summary.csv")}
    for file in ("requests.csv", "steps.csv.gz"):
        assert written["disagg"][file] == [*written["single"][file], *added[file]], f"docs/outputs.md, {file}"
    fleet = set(written["fleet"]["summary.csv"])
    assert set(written["disagg"]["summary.csv"]) == fleet | set(added["summary.csv"])


AUTOSCALE_FILES = ("timeline.csv", "lifetimes.csv", "scaling.csv")


def test_the_outputs_reference_lists_the_columns_an_autoscaled_run_writes(written):
    from harness.autoscale.study import COLUMNS

    text = (REPO / "docs" / "outputs.md").read_text()
    for file in AUTOSCALE_FILES:
        assert _section_columns(text, file) == written["autoscale"][file], f"docs/outputs.md, {file}"
    extras = _section_columns(text, "Autoscale summary columns")
    fleet = set(written["fleet"]["summary.csv"])
    assert set(written["autoscale"]["summary.csv"]) == fleet | set(extras) and not fleet & set(extras)
    study = _section_columns(text, "autoscale.csv and cold_start.csv (`experiment=autoscale`)")
    assert study == [*COLUMNS, "attainment_lost"]  # cold_start.csv adds the last


def test_the_architecture_map_names_files_that_exist():
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Which file holds which mechanism")[1]
    paths = [p for row in re.findall(r"^\|.*\| (`.+`) \|$", table, re.M) for p in re.findall(r"`([^`]+)`", row)]
    assert len(paths) > 40
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_seam_snippet_in_the_architecture_map_runs():
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "architecture.md").read_text(), re.S)
    assert len(blocks) == 1
    result = subprocess.run([sys.executable, "-c", blocks[0]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    steps, recorded = re.fullmatch(r"(\d+) steps; (\d+) recorded\n", result.stdout).groups()
    assert int(steps) == int(recorded) > 0


def _extending_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), re.S)


def test_each_extension_registry_is_defined_in_the_file_the_page_names():
    boxes = re.findall(r"\*\*Registry\*\* `(\w+)` in `([^`]+)`", (REPO / "docs" / "extending.md").read_text())
    assert {name for name, _ in boxes} >= {"POLICIES", "ROUTER_REGISTRY", "COST_MODELS", "ARCHITECTURES", "BACKENDS",
                                          "STUDIES", "ATTENTION"}
    for name, path in boxes:
        assert re.search(rf"^{name}\b[^=\n]*= *Registry\(", (REPO / path).read_text(), re.M), f"{name} not in {path}"


def test_the_router_sketch_registers_and_routes_as_shown():
    sketch = next(block for block in _extending_blocks() if '@ROUTER_REGISTRY.register("power_of_two")' in block)
    check = """
from engine.core.request import Request
from engine.core.routers import RouterConfig, make_router
from engine.core.sampling_params import SamplingParams

class Load:
    def __init__(self, tokens): self.tokens = tokens
    def outstanding_requests(self): return 0
    def outstanding_tokens(self): return self.tokens

router = make_router(RouterConfig(name="power_of_two"), 16)
picks = {router.route(Request(str(i), [1] * 8, SamplingParams(max_tokens=1)), [Load(5), Load(0), Load(9)])
         for i in range(50)}
assert picks <= {0, 1} and 1 in picks, picks   # replica 2 only ever pairs with a less loaded one
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", sketch + check], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-3000:]


def test_the_config_group_table_lists_every_option():
    from harness.arguments import config_groups, group_options

    text = (REPO / "docs" / "running.md").read_text()
    table = text.split("## Config groups")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", table, re.M))
    for group in sorted(config_groups() - {"serve"}):  # serve: python -m harness.serve's, docs/serving.md
        assert group in rows, f"docs/running.md: no row for the config group {group!r}"
        listed = set(re.findall(r"`([^`]+)`", rows[group]))
        missing = [name for name in group_options(group) if name not in listed]
        assert not missing, f"docs/running.md: the {group} row lacks {missing}"
