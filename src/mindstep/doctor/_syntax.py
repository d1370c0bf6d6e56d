"""Small helpers over Python's `ast` shared by the doctor's modules."""
from __future__ import annotations

import ast


def dotted(node) -> str:
    """`ms.ops.AllReduce` -> 'ms.ops.AllReduce'; anything else -> ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def last(node) -> str:
    name = dotted(node)
    return name.rsplit(".", 1)[-1] if name else ""


def kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


