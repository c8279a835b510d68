"""The layers of rollplex/ (pyproject.toml's [tool.importlinter]) hold, a wrong import breaks
them, and no module of rollplex/ imports itself back through others.

Every check reads grimp's import graph, which holds function-level and TYPE_CHECKING imports
too: a cycle hidden behind a lazy import is still a cycle."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import importlinter.api  # noqa: F401  (configures importlinter's settings)
import networkx as nx
import pytest
from importlinter.application.use_cases import create_report, read_user_options
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import registry

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"
NO_PYC = shutil.ignore_patterns("__pycache__", "*.pyc")
CONTRACT_TYPES = {
    "layers": LayersContract,
    "independence": IndependenceContract,
    "forbidden": ForbiddenContract,
}
for _name, _cls in CONTRACT_TYPES.items():  # as `lint-imports` registers them
    registry.register(_cls, _name)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("rollplex", cache_dir=None)


def contracts():
    """pyproject's contracts, built by importlinter from its own reading of the file."""
    options = read_user_options(str(CONFIG))
    return [
        CONTRACT_TYPES[c["type"]](c["name"], options.session_options, c)
        for c in options.contracts_options
    ]


def broken(graph: grimp.ImportGraph) -> set[str]:
    """Ids of the contracts that `graph` breaks (each checked on its own copy: a contract
    removes its ignored imports from the graph it is given)."""
    return {
        c.contract_options["id"]
        for c in contracts()
        if not c.check(copy.deepcopy(graph), verbose=False).kept
    }


def test_the_contracts_name_every_kind_the_issue_asks_for():
    kinds = {c.contract_options["id"]: c.contract_options["type"] for c in contracts()}
    assert kinds == {
        "layers": "layers",
        "algos-data": "independence",
        "ops-weights": "independence",
        "algos-models": "independence",
        "graph-data": "independence",
        "planner-plans-only": "forbidden",
        "torch-backend-alone": "forbidden",
    }


def test_lint_imports_keeps_every_contract():
    report = create_report(read_user_options(str(CONFIG)), cache_dir=None)
    assert not report.could_not_run and not report.invalid_contract_options
    assert not report.contains_failures
    assert report.kept_count == len(contracts()) and report.broken_count == 0


# (importer, imported, the contracts that import breaks)
WRONG = [
    # up from the bottom: then the graph reaches the data, and the planner the roles, through it
    (
        "rollplex.specs.base",
        "rollplex.backends.base",
        {"layers", "graph-data", "planner-plans-only"},
    ),
    ("rollplex.backends.step", "rollplex.runtime.dispatch", {"layers"}),  # roles know the runtime
    ("rollplex.jobs.sizing", "rollplex.cli", {"layers"}),
    ("rollplex.data.prompts", "rollplex.graph.ir", {"layers", "graph-data"}),  # siblings
    ("rollplex.algos.grpo", "rollplex.data.prompts", {"algos-data"}),  # allowed by the layers
    ("rollplex.models.folder", "rollplex.algos.grpo", {"layers", "algos-models"}),
    ("rollplex.ops.costs", "rollplex.weights.algebra", {"layers", "ops-weights"}),
    ("rollplex.planner.api", "rollplex.runtime.executor", {"layers", "planner-plans-only"}),
    ("rollplex.planner.order", "rollplex.backends", {"layers", "planner-plans-only"}),
    ("rollplex.trace.gantt", "rollplex.engine.session", {"layers"}),  # engine | trace
    ("rollplex.graph.ir", "rollplex.extras.tool", {"layers"}),  # a package no layer names
    # sibling backends: vLLM's and FSDP's build on the torch backend, never the reverse
    ("rollplex.backends.torch.data", "rollplex.backends.vllm.prompts", {"torch-backend-alone"}),
    ("rollplex.backends.torch.roles", "rollplex.backends.fsdp.shard", {"torch-backend-alone"}),
]


def test_the_tree_as_it_is_breaks_no_contract(graph):
    assert broken(graph) == set()


@pytest.mark.parametrize(("importer", "imported", "contracts_broken"), WRONG)
def test_a_wrong_import_breaks_its_contracts(graph, importer, imported, contracts_broken):
    wrong = copy.deepcopy(graph)
    for module in (importer, imported):
        if module not in wrong.modules:  # a package that does not exist (yet)
            wrong.add_module(module.rsplit(".", 1)[0])
            wrong.add_module(module)
    wrong.add_import(importer=importer, imported=imported, line_number=1, line_contents="import")
    assert broken(wrong) == contracts_broken


def test_lint_imports_fails_on_a_function_level_import_in_a_copy_of_the_tree(tmp_path):
    """End to end, as `make test` runs it: the command fails on a lazy upward import written
    into a copy of rollplex/, and names the contract and the import."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip(f"no lint-imports beside {sys.executable} (pip install -e '.[dev]')")
    shutil.copytree(ROOT / "rollplex", tmp_path / "rollplex", ignore=NO_PYC)
    shutil.copy(CONFIG, tmp_path / "pyproject.toml")
    order = tmp_path / "rollplex" / "planner" / "order.py"
    order.write_text(
        order.read_text() + "\n\ndef _wrong():\n    from rollplex.runtime import executor\n"
    )
    run = subprocess.run(
        [str(lint), "--no-cache", "--config", "pyproject.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    kept = len(contracts()) - 2
    assert f"Contracts: {kept} kept, 2 broken." in run.stdout, run.stdout
    assert "rollplex.planner.order -> rollplex.runtime.executor" in run.stdout, run.stdout


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of rollplex modules that import each other in a circle (a strongly
    connected component of the module-level import graph), a module importing itself too."""
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        g.add_edges_from((m, d) for d in graph.find_modules_directly_imported_by(m))
    return sorted(
        sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1 or g.has_edge(*c, *c)
    )


def test_no_module_of_rollplex_imports_itself_back(graph):
    assert module_cycles(graph) == []


def test_the_cycle_check_finds_a_circle_through_a_lazy_import(graph):
    """values.py and micro.py imported each other until their types got one home: put the
    import back and the check names the circle."""
    wrong = copy.deepcopy(graph)
    wrong.add_import(
        importer="rollplex.backends.torch.values",
        imported="rollplex.backends.torch.micro",
        line_number=1,
        line_contents="from rollplex.backends.torch.micro import micro_ranges",
    )
    (cycle,) = module_cycles(wrong)
    assert {"rollplex.backends.torch.values", "rollplex.backends.torch.micro"} <= set(cycle)
