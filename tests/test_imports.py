"""The project's modules import one another without a cycle, counting imports inside functions
(a cycle hidden in a function-level import is still one), and in one direction between the
layers: `api -> engine -> score_kernels -> _native`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "engine", "score_kernels", "_native", "bench")
LAYERS = {"api": 3, "engine": 2, "score_kernels": 1, "_native": 0}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` imports anywhere in it (a package's `__init__` counted as
    the package, `from package import module` as the module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports(path, name, set(modules)) for name, path in modules.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def parents_of(name: str) -> set[str]:
    """A module's enclosing packages: importing a module runs their `__init__` first, which is
    not an edge of ours."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_module_imports_itself_through_others():
    edges = {name: deps - parents_of(name) for name, deps in graph().items()}
    assert cycle(edges) is None, " -> ".join(cycle(edges))


def test_the_layers_import_downwards_only():
    upward = [
        (name, dep)
        for name, deps in graph().items()
        for dep in deps
        if name.split(".")[0] in LAYERS
        and dep.split(".")[0] in LAYERS
        and LAYERS[dep.split(".")[0]] > LAYERS[name.split(".")[0]]
    ]
    assert upward == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
