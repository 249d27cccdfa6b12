"""gradcache/train reads as layers (gradcache/train/README.md, "Layers"): every import of one of its files by
another (at module level, under TYPE_CHECKING or inside a function) runs down the table or within one row, and no
group of its files imports each other in a circle. The graph is built from the source with `ast`, not by importing
it, so an import that runs only in a function or only for a type checker counts too."""
from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import gradcache.train

TRAIN = Path(gradcache.train.__file__).parent
PACKAGE = "gradcache.train"

README = TRAIN / "README.md"


def _layers() -> tuple[tuple[str, ...], ...]:
    """The rows of the README's table under "## Layers", top to bottom, each as its modules' dotted names below the
    package (`run_folder/layout.py` -> "run_folder.layout", `commands/` -> "commands"); the package's own
    `__init__.py`, which imports nothing of the program, last."""
    section = README.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    return (*(tuple(name.strip(" `").removesuffix(".py").removesuffix("/").replace("/", ".")
                    for name in row.split(",")) for row in rows), ("",))


LAYERS = _layers()  # a module's row: the row of its longest prefix


# Violations other branches of issue 45 remove; the lead empties this set as each lands. An entry that is no longer
# a violation fails `test_every_pending_entry_is_still_a_violation`, so the set cannot outlive its reason.
PENDING: set[tuple[str, str] | frozenset[str]] = set()


@functools.cache
def modules() -> dict[str, Path]:
    """Each file of gradcache/train by its dotted name below the package ("" for the package itself)."""
    found = {}
    for path in TRAIN.rglob("*.py"):
        parts = path.relative_to(TRAIN).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(the module of gradcache/train imported, line) for every import statement anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
                module = f"{PACKAGE}.{module}" if module else PACKAGE
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
            targets = targets[:-1] if any(_below(t) in known for t in targets[:-1]) else targets[-1:]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                imported = _resolve(_below(target), known)
                if imported != name:
                    yield imported, node.lineno


def _below(target: str) -> str:
    return target[len(PACKAGE) + 1:] if target != PACKAGE else ""


def _resolve(target: str, known: dict[str, Path]) -> str:
    while target not in known:  # `from gradcache.train.x import name`: name is an attribute of module x
        target = target.rpartition(".")[0]
    return target


def layer(name: str) -> int:
    rows = [(len(prefix), row) for row, prefixes in enumerate(LAYERS) for prefix in prefixes
            if name == prefix or name.startswith(prefix + ".") or prefix == ""]
    return max(rows)[1]


@functools.cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does}."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges[name] = {}
        for imported, line in imports(name, path, known):
            edges[name].setdefault(imported, line)
    return edges


def upward(edges: dict[str, dict[str, int]]) -> dict[tuple[str, str], int]:
    return {(name, imported): line for name, targets in edges.items() for imported, line in targets.items()
            if layer(imported) < layer(name)}


def cycles(edges: dict[str, dict[str, int]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for imported in edges[name]:
            if imported not in index:
                visit(imported)
                low[name] = min(low[name], low[imported])
            elif imported in stack:
                low[name] = min(low[name], index[imported])
        if low[name] == index[name]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == name:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return found


def _file(name: str) -> str:
    return str(modules()[name].relative_to(TRAIN.parent.parent))


def test_every_module_has_a_row_and_every_row_a_module():
    known = modules()
    assert all(any(layer(name) == row for name in known) for row in range(len(LAYERS)))
    unlisted = sorted(name for name in known if layer(name) == len(LAYERS) - 1 and name)
    assert not unlisted, f"add these to the README's table of layers: {unlisted}"


def test_no_import_runs_up_the_layers():
    found = upward(graph())
    new = sorted(set(found) - PENDING)
    assert not new, "imports up the layers (README.md, Layers): " + "; ".join(
        f"{_file(name)}:{found[name, imported]} imports {_file(imported)}" for name, imported in new)


def test_no_files_import_each_other_in_a_circle():
    edges = graph()
    new = sorted(sorted(component) for component in cycles(edges) - PENDING)
    assert not new, "import cycles: " + "; ".join(
        " <-> ".join(f"{_file(name)}" for name in component) for component in new)


def test_every_pending_entry_is_still_a_violation():
    edges = graph()
    gone = [entry for entry in PENDING if entry not in set(upward(edges)) | cycles(edges)]
    assert not gone, f"no longer violations: remove {gone} from PENDING"


def test_the_graph_sees_imports_in_functions_and_for_type_checkers(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gradcache.train.loop import x\n"
                      "def f():\n    from gradcache.train import preflight\n    from . import bad_data\n")
    found = {imported for imported, _ in imports("data.probe", source, modules())}
    assert found == {"loop", "preflight", "data.bad_data"}
    assert upward({"data.probe": dict.fromkeys(found, 1)}) == {("data.probe", "loop"): 1, ("data.probe", "preflight"): 1}
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == {frozenset("abc")}
