"""Tools from verl's tool YAML (a file path, or ``pkg://package/path`` for one shipped in a package,
e.g. ``pkg://verl.trainer.config/tool_config/calculator.yaml``)::

tools:
  - class_name: verl.tools.calculator_tool.CalculatorTool
    config: {timeout_s: 5}
    tool_schema:               # optional when the class has a built-in schema
      type: function
      function: {name: calculator, description: ..., parameters: {...}}
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
from typing import Any

import yaml

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def load_class(class_name: str, where: str, base: type) -> type:
    """The class a YAML entry's ``class_name`` (``package.module.Class``) names, checked to subclass
    ``base``; errors name ``where`` (the file and entry). The one loader of tools and interactions."""
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}.class_name: {class_name!r} is not a dotted path (package.module.Class)")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{where}.class_name: cannot import {class_name!r} ({error})") from error
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(
            f"{where}.class_name: {class_name!r} is not a subclass of {base.__module__}.{base.__qualname__}"
        )
    return cls


def get_tool_class(class_name: str, where: str) -> type[BaseTool]:
    return load_class(class_name, where, BaseTool)


def resolve_tool_config_path(path: str, key: str = TOOL_CONFIG_KEY) -> str:
    """``pkg://package.name/relative/file.yaml`` -> the file inside that installed package (so a
    preset can name a YAML it ships, from any working directory); other paths: ``~`` expanded.
    ``key``: the config key that gave the path, for the error."""
    if not path.startswith("pkg://"):
        return os.path.expanduser(path)
    package, _, relative = path.removeprefix("pkg://").partition("/")
    try:
        return str(importlib.resources.files(package).joinpath(relative))
    except ModuleNotFoundError as error:
        raise FileNotFoundError(f"{key}: {path}: no package {package!r}") from error


def initialize_tools_from_config(tools_config_file: str) -> list[BaseTool]:
    """Instantiate every tool of the YAML file; errors name the file, the entry and the field."""
    path = resolve_tool_config_path(tools_config_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{TOOL_CONFIG_KEY}: {path}: no such file")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a top-level `tools:` list with at least one tool")
    tools: list[BaseTool] = []
    for i, entry in enumerate(entries):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where}: expected a mapping with class_name (and config, tool_schema)")
        cls = get_tool_class(entry["class_name"], where)
        schema_dict: Any = entry.get("tool_schema")
        schema = (
            OpenAIFunctionToolSchema.from_dict(schema_dict, f"{where}.tool_schema") if schema_dict else None
        )
        tools.append(cls(entry.get("config") or {}, schema))
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: tool names must be unique; repeated: {duplicates}")
    return tools
