"""Every repository path that docs/architecture.md and README.md's Layout section name in
backticks exists, and every `rollplex.x.y` they name (backticked or not) is a module or a
module's top-level name, so the map cannot drift from the code again.

A span counts as a path when it has no spaces or placeholders and ends in `.py`, is one
folder (`torch/`), or starts with a top-level folder of the repository or a package of
rollplex. A path resolves from the repository root, from `rollplex/`, or from a folder
that the same paragraph (or table row) names, so README's `base.py` in the `backends/`
row is rollplex/backends/base.py.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rollplex"
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
PACKAGES = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
DOTTED = re.compile(r"(?<![\w/.])rollplex(?:\.(?!py\b)\w+)+")  # in prose and figures too
NOT_A_PATH = re.compile(r"[\s*<>{}~=:()\[\],]")  # globs, placeholders, URLs, overrides, code


def spans(block: str) -> list[str]:
    """Backticked spans, paired across line breaks as Markdown pairs them."""
    return re.findall(r"`([^`]+)`", block)


def is_path(span: str) -> bool:
    """`x.py`, a folder alone (`torch/`), or a path under a top folder or package; not a
    path of a run's output (`checkpoints/step-NNNNNN/`)."""
    if NOT_A_PATH.search(span) or ("/" not in span and not span.endswith(".py")):
        return False
    first = span.split("/")[0]
    return span.endswith(".py") or first in TOP | PACKAGES or span == first + "/"


def resolve(span: str, folders: list[Path]) -> Path | None:
    for base in [ROOT, PACKAGE, *folders]:
        if (base / span).exists():
            return base / span
    return None


def module_names(file: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_exists(span: str) -> bool:
    """`rollplex.a.b[.name]`: a module or package, optionally one name defined in it."""
    parts, where = span.split(".")[1:], PACKAGE
    while parts and (where / parts[0]).is_dir():
        where, parts = where / parts[0], parts[1:]
    if parts and (where / f"{parts[0]}.py").exists():
        where, parts = where / f"{parts[0]}.py", parts[1:]
    if not parts:
        return True
    file = where / "__init__.py" if where.is_dir() else where
    return len(parts) == 1 and file.exists() and parts[0] in module_names(file)


def blocks(text: str) -> list[str]:
    """Paragraphs, with each table row a block of its own."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        rows = [line for line in para.splitlines() if line.startswith("|")]
        out += rows if rows else [para]
    return out


def missing(text: str) -> list[str]:
    gone = []
    for block in blocks(text):
        paths = [s for s in spans(block) if is_path(s)]
        folders = [f for s in paths if (f := resolve(s, [])) is not None and f.is_dir()]
        gone += [s for s in paths if resolve(s, folders) is None]
        gone += [d for d in DOTTED.findall(block) if not dotted_exists(d)]
    return gone


def layout_section() -> str:
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert section, "README.md has no '## Layout' section"
    return section.group(1)


@pytest.mark.parametrize(
    "name, text",
    [
        ("docs/architecture.md", (ROOT / "docs/architecture.md").read_text()),
        ("README.md Layout", layout_section()),
    ],
)
def test_every_path_the_docs_name_exists(name, text):
    assert missing(text) == [], f"{name} names paths that do not exist"


def test_the_check_finds_a_missing_path_and_ignores_what_is_not_a_path():
    text = (
        "Moved: `runtime/hooks.py`, `backends/capabilities.py`, `rollplex.runtime.pools`,\n"
        "`rollplex.planner.pools.torchrun_world`, `nowhere.py`, rollplex.runtime.hooks.\n\n"
        "Fine: `backends/hooks.py`, `planner/pools.py`, `rollplex.planner.pools.Pools`,\n"
        "`tests/`, `conf/algo/`, `data.template`, `backend.rollout=vllm`, `bench/results/*.md`,\n"
        "`checkpoints/step-NNNNNN/` (a run's folder), rollplex.planner.simulate in prose,\n"
        "`planner/schedules/rollplex.py`.\n\n"
        "| `engine/` | `session.py`, `phases.py` |\n"
        "| `jobs/` | `session.py` |"
    )
    assert missing(text) == [
        "runtime/hooks.py",
        "backends/capabilities.py",
        "nowhere.py",
        "rollplex.runtime.pools",
        "rollplex.planner.pools.torchrun_world",
        "rollplex.runtime.hooks",
        "session.py",  # the jobs row: only the engine row's folder holds a session.py
    ]


def test_the_layout_figure_is_the_import_linter_layers_contract():
    """docs/architecture.md's layer figure lists pyproject's layers, top down."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    doc = (ROOT / "docs/architecture.md").read_text()
    figure = re.search(r"## Layers\n\n```\n(.*?)```", doc, re.S)
    assert figure, "docs/architecture.md has no layer figure under '## Layers'"
    drawn = []
    for line in figure.group(1).splitlines():
        names = re.findall(r"rollplex\.(\w+)", line)
        drawn.append(" | ".join(names))
    assert drawn == layers
