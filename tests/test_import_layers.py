"""Imports run one way: config and algorithms at the bottom, workers above them, the trainer on top.

Read from the source with ``ast`` (every import, including those inside functions); imports
under ``if TYPE_CHECKING:`` are annotations only and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[1] / "verl"

# package -> packages it must never import
FORBIDDEN = {
    "verl.config": ("verl.trainer", "verl.workers", "verl.experimental", "verl.single_controller"),
    "verl.algorithms": ("verl.trainer", "verl.workers", "verl.config", "verl.experimental"),
    "verl.utils": ("verl.trainer", "verl.workers", "verl.experimental"),
    "verl.workers": ("verl.trainer",),
    "verl.single_controller": ("verl.trainer", "verl.workers"),
    "verl.tools": ("verl.trainer", "verl.workers"),
    "verl.experimental": ("verl.trainer",),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(VERL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Yield (line, imported module) for every runtime import in ``tree``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from verl import trainer` imports verl.trainer
                yield node.lineno, f"{node.module}.{alias.name}"
        stack.extend(ast.iter_child_nodes(node))


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations() -> list[str]:
    found = []
    for path in sorted(VERL.rglob("*.py")):
        module = _module_name(path)
        rules = [(pkg, banned) for pkg, banned in FORBIDDEN.items() if _within(module, pkg)]
        if not rules:
            continue
        for line, imported in _imports(ast.parse(path.read_text(), filename=str(path))):
            for pkg, banned in rules:
                if any(_within(imported, b) for b in banned):
                    found.append(
                        f"{path.relative_to(VERL.parent)}:{line} imports {imported} ({pkg} must not)"
                    )
    return sorted(set(found))


def test_imports_run_one_way():
    assert _violations() == []


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The walk finds an import buried in a function and ignores one under TYPE_CHECKING."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from verl.trainer.ppo import ray_trainer\n"
        "def f():\n    from verl.trainer.ppo.validation import Validator\n"
    )
    found = [name for _, name in _imports(ast.parse(source))]
    assert "verl.trainer.ppo.validation" in found
    assert "verl.trainer.ppo" not in found and "verl.trainer.ppo.ray_trainer" not in found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_layer_exists(package):
    assert (VERL.parent / package.replace(".", "/")).is_dir(), package
