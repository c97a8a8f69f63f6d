"""The core has no import circle: every import of one ebmcore module by another (at module level or inside a
function) goes one way, so no module needs another that is still half initialised."""

import ast
from pathlib import Path

import ebmcore

ROOT = Path(ebmcore.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The ebmcore modules ``path`` imports by name (``from ebmcore import x`` counts as ``ebmcore.x`` if it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_in_the_core():
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {name: _imports(path, name, set(paths)) for name, path in paths.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, (
                "import circle: " + " -> ".join(trail[trail.index(nxt) :] + [node, nxt])
                if nxt in trail
                else f"import circle through {node} -> {nxt}"
            )
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert len(graph) > 20  # the walk saw the core


def test_the_core_knows_no_loss_and_no_plugins_component_list():
    """The core defines the programs, the chains and the plugin machinery; what the losses compute (contrastive
    divergence, score matching, weight gradients of a network) and what each plugin registers are the plugins' own
    (``ebm_losses.ops``; ``[tool.ebm.provides]`` of each plugin's pyproject.toml)."""
    import re

    words = re.compile(
        r"contrastive|energy.?gradients|weight.grad|score.matching|\bnce\b|persistent|"
        r"\"(?:mala|hmc|nuts|leapfrog|heun|dopri5)\"",
        re.I,
    )
    found = [
        f"{path.relative_to(ROOT.parent)}:{i}: {line.strip()}"
        for path in sorted(ROOT.rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if words.search(line)
    ]
    assert found == [], "the core names what belongs to a plugin:\n" + "\n".join(found)


def test_the_core_defines_no_type_of_one_algorithm():
    """The concepts the core defines (its classes, and the fields and methods of each) belong to every sampler: the
    run a sampler prepares, its plan, the loop. What one algorithm's chain computes is that algorithm's own type
    (``ebm_samplers.langevin.ULAChain``, which contrastive divergence reads), not the core's."""
    import re

    algorithm = re.compile(r"langevin|\bula|ula_|mala|hmc|nuts|leapfrog|temper|anneal|euler|heun|dopri", re.I)
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            members = [node.name] + [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            members += [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
            found += [
                f"{path.relative_to(ROOT.parent)}: {node.name}" + ("" if m is node.name else f".{m}")
                for m in members
                if algorithm.search(m)
            ]
    assert found == [], "the core defines what belongs to one algorithm:\n" + "\n".join(found)
    assert len(list(ROOT.rglob("*.py"))) > 20  # the walk saw the core
