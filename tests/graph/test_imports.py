"""The graph package stands on its own: ops (costs) import it, never the other way."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollplex.graph

GRAPH = Path(rollplex.graph.__file__).parent


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at top level?) for every import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, id(node) in top))
        elif isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
    return out


def test_graph_never_imports_ops_or_planner_and_has_no_lazy_imports() -> None:
    for path in GRAPH.rglob("*.py"):
        for module, top in _imports(path):
            where = f"{path.relative_to(GRAPH)} imports {module}"
            assert not module.startswith(("rollplex.ops", "rollplex.planner")), where
            assert top or not module.startswith("rollplex"), f"{where} inside a function"


def test_the_schema_registers_builtins_on_first_import() -> None:
    code = (
        "import sys\n"
        "from rollplex.graph.schema import get_kind\n"
        "assert get_kind('decode').name == 'decode'\n"
        "assert not any(m.startswith('rollplex.ops') for m in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
