"""``calculator``: evaluates one arithmetic expression (integers, + - * / // % ** and parentheses).

The expression is parsed with :mod:`ast` and only number literals and arithmetic operators are
evaluated (no names, calls or attributes), with a bound on the size of powers, so a model cannot
run code through it. It doubles as the example of a tool (see docs/agents.md).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionSchema, OpenAIFunctionToolSchema, ToolResponse

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; ValueError for anything but arithmetic on numbers."""

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"cannot parse {expression!r}") from error
    return walk(tree.body)


class CalculatorTool(BaseTool):
    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(
            OpenAIFunctionSchema(
                name="calculator",
                description="Evaluate an arithmetic expression and return its value.",
                parameters={
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
                    "required": ["expression"],
                },
            )
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            return ToolResponse(text="Error: expected a string argument `expression`"), 0.0, {"ok": 0}
        try:
            value = evaluate(expression)
        except (ValueError, ZeroDivisionError, OverflowError) as error:
            return ToolResponse(text=f"Error: {error}"), 0.0, {"ok": 0}
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResponse(text=str(value)), 0.0, {"ok": 1}
