"""Imports run one way, through named layers, and no module imports itself back through others.

Read from the source with ``ast``: every import counts, including those inside functions (an import
moved into a function is still a dependency); imports under ``if TYPE_CHECKING:`` are annotations
only and do not count. Two checks:

* **Layers.** Every module of ``verl`` belongs to one layer (the longest prefix in ``LAYERS``), and
  each layer may import only the layers ``MAY_IMPORT`` lists for it; those lists form no cycle.
  From the bottom: the leaf ``utils`` (torch helpers, checkpoint I/O, tracking, the cache folder)
  imports nothing of ``verl``; the config sits above it; data (datasets, reward scorers) above the
  config; workers above that; the trainer on top of the library; the built-in tasks and models above
  the library; the entry points (``main_ppo``, the SFT/RM trainers, ``doctor``) above everything.
  The package's root (``verl/__init__.py``) imports the protocol only (``from verl import DataProto``).
* **No module cycle** among all of ``verl``'s modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[1] / "verl"

LAYERS = {
    "verl": "root",
    "verl.utils": "utils",
    "verl.utils.dataset": "data",
    "verl.utils.reward_score": "data",
    "verl.protocol": "protocol",
    "verl.protocol_ops": "protocol",
    "verl.protocol_future": "protocol",
    "verl.keys": "protocol",
    "verl.base_config": "config",
    "verl.algorithms": "algorithms",
    "verl.tools": "tools",
    "verl.interactions": "interactions",
    "verl.config": "config",
    "verl.single_controller": "single_controller",
    "verl.workers": "workers",
    "verl.experimental": "experimental",
    "verl.model_merger": "model_merger",
    "verl.trainer": "trainer",
    "verl.builtin": "builtin",
    "verl.trainer.main_ppo": "entry",
    "verl.trainer.main_generation_server": "entry",
    "verl.trainer.main_ppo_sync": "entry",
    "verl.trainer.sft_trainer": "entry",
    "verl.trainer.rm_trainer": "entry",
    "verl.trainer.fsdp_sft_trainer": "entry",
    "verl.experimental.one_step_off_policy.main_ppo": "entry",
    "verl.experimental.fully_async_policy.fully_async_main": "entry",
    "verl.experimental.async_entry": "entry",
    "verl.doctor": "entry",
}
"""Module prefix -> layer; a module belongs to the layer of its longest matching prefix."""

LIBRARY = (
    "utils",
    "protocol",
    "algorithms",
    "tools",
    "config",
    "data",
    "interactions",
    "single_controller",
    "workers",
    "experimental",
    "model_merger",
    "trainer",
)
MAY_IMPORT = {
    "root": ("protocol",),  # `from verl import DataProto`, loaded on first use
    "utils": (),
    "protocol": ("utils",),
    "algorithms": ("utils",),
    "tools": ("utils",),
    "config": ("utils", "algorithms"),
    "data": ("utils", "protocol", "tools", "config"),
    "interactions": ("utils", "tools", "data"),  # the tools' class loader; the scorers
    "single_controller": ("utils", "protocol"),
    "workers": ("utils", "protocol", "algorithms", "tools", "config", "data", "single_controller"),
    "experimental": (
        "utils",
        "protocol",
        "algorithms",
        "tools",
        "config",
        "data",
        "interactions",
        "single_controller",
        "workers",
    ),
    "model_merger": ("utils", "protocol", "config", "workers"),
    "trainer": tuple(layer for layer in LIBRARY if layer != "trainer"),
    "builtin": LIBRARY,
    "entry": (*LIBRARY, "builtin"),
}
"""Layer -> the other layers it may import. Anything else is a violation."""


def _module_name(path: Path, root: Path = VERL) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
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


def layer_of(module: str) -> str | None:
    matches = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return LAYERS[max(matches, key=len)] if matches else None


def import_graph(root: Path = VERL) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: first line}, imports resolved to the longest
    existing module (``from verl.x import name`` is an import of ``verl.x`` unless ``verl.x.name``
    is a module)."""
    sources = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in sources.items():
        edges: dict[str, int] = {}
        for line, name in _imports(ast.parse(path.read_text(), filename=str(path))):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return graph


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    found = []
    for module, edges in graph.items():
        mine = layer_of(module)
        if mine is None:
            found.append(f"{module} belongs to no layer (add its prefix to LAYERS)")
            continue
        for imported, line in edges.items():
            theirs = layer_of(imported)
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                found.append(f"{module}:{line} imports {imported} ({mine} may not import {theirs})")
    return sorted(found)


def module_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_imports_run_one_way_through_the_layers():
    assert layer_violations(import_graph()) == []


def test_no_module_imports_itself_back():
    assert module_cycles(import_graph()) == []


def test_the_layers_allowed_imports_form_no_cycle():
    graph = {layer: dict.fromkeys(allowed, 0) for layer, allowed in MAY_IMPORT.items()}
    assert module_cycles(graph) == []
    assert set(LAYERS.values()) == set(MAY_IMPORT)


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "verl"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_the_checker_sees_a_cycle_hidden_in_a_function(tmp_path):
    root = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "",
            "config/a.py": "from verl.config import b\n",
            "config/b.py": "def f():\n    from verl.config.a import x\n",
            "config/c.py": "from verl.config import a\n",
        },
    )
    assert module_cycles(import_graph(root)) == [["verl.config.a", "verl.config.b"]]


def test_the_checker_sees_a_utils_module_importing_the_config(tmp_path):
    root = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "",
            "config/data.py": "X = 1\n",
            "utils/__init__.py": "",
            "utils/io.py": "def f():\n    from verl.config.data import X\n",
            "utils/dataset/__init__.py": "",
            "utils/dataset/rows.py": "from verl.config.data import X\n",  # data sits above the config
        },
    )
    assert layer_violations(import_graph(root)) == [
        "verl.utils.io:2 imports verl.config.data (utils may not import config)"
    ]


def test_the_checker_ignores_imports_for_type_checking_only():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from verl.trainer.ppo import ray_trainer\n"
        "def f():\n    from verl.trainer.ppo.validation import Validator\n"
    )
    found = [name for _, name in _imports(ast.parse(source))]
    assert "verl.trainer.ppo.validation" in found
    assert "verl.trainer.ppo" not in found and "verl.trainer.ppo.ray_trainer" not in found


@pytest.mark.parametrize("prefix", sorted(LAYERS))
def test_every_layer_prefix_exists(prefix):
    path = VERL.parent / prefix.replace(".", "/")
    assert path.is_dir() or path.with_suffix(".py").is_file(), prefix
