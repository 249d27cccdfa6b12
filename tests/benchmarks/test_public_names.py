"""The benchmarks use gradcache's public names only: no import of a `_name`, no `module._name`, so a benchmark
measures what a user can call and a private helper may change without breaking one."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _private_uses(path: Path) -> list[str]:
    """Each `from gradcache... import _name` and `gradcache_module._name` of `path`, as "file:line name"."""
    tree = ast.parse(path.read_text(), filename=str(path))
    gradcache_names, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gradcache":
            for alias in node.names:
                gradcache_names.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            gradcache_names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("gradcache")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in gradcache_names:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_benchmark_reaches_into_a_private_gradcache_name():
    sources = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(sources) > 10
    assert [use for path in sources for use in _private_uses(path)] == []
