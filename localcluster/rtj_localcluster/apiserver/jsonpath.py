"""The JSONPath dialect of CRD ``additionalPrinterColumns`` (kubectl's JSONPath), for ``tables``.

Supported: ``.field``, ``['field']``, ``[n]`` (negative too), ``[*]``, ``[start:end]`` and filters
``[?(@.path op literal)]`` with ``== != < <= > >=`` or ``[?(@.path)]`` (the field exists), optionally
wrapped in ``{...}``. :func:`evaluate` returns every match in order.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FILTER = re.compile(r"^\?\(\s*@((?:\.[A-Za-z0-9_\-/]+|\['[^']*'\])*)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*\)$")


def _split(path: str) -> list[str]:
    """Split a path into steps: ``name`` or ``[bracket expression]``."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    steps: list[str] = []
    i = 0
    while i < len(path):
        ch = path[i]
        if ch == ".":
            i += 1
            j = i
            while j < len(path) and path[j] not in ".[":
                j += 1
            if j > i:
                steps.append(path[i:j])
            i = j
        elif ch == "[":
            depth, j = 0, i
            quote: str | None = None
            while j < len(path):
                c = path[j]
                if quote:
                    if c == quote:
                        quote = None
                elif c in "'\"":
                    quote = c
                elif c == "[":
                    depth += 1
                elif c == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            steps.append(path[i : j + 1])
            i = j + 1
        else:
            j = i
            while j < len(path) and path[j] not in ".[":
                j += 1
            steps.append(path[i:j])
            i = j
    return steps


def _literal(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _compare(op: str, left: Any, right: Any) -> bool:
    if isinstance(right, int | float) and isinstance(left, str):
        try:
            left = float(left)
        except ValueError:
            return False
    try:
        if op == "==":
            return bool(left == right)
        if op == "!=":
            return bool(left != right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    except TypeError:
        return False


def evaluate(obj: Any, path: str) -> list[Any]:
    current = [obj]
    for step in _split(path):
        nxt: list[Any] = []
        if not step.startswith("["):
            for node in current:
                if isinstance(node, dict) and step in node:
                    nxt.append(node[step])
            current = nxt
            continue
        inner = step[1:-1].strip()
        m = _FILTER.match(inner)
        if m:
            sub, op, lit = m.group(1), m.group(2), m.group(3)
            for node in current:
                candidates = (
                    node if isinstance(node, list) else node.values() if isinstance(node, dict) else []
                )
                for element in candidates:
                    found = evaluate(element, sub) if sub else [element]
                    if op is None:
                        if found:
                            nxt.append(element)
                    elif found and _compare(op, found[0], _literal(lit)):
                        nxt.append(element)
            current = nxt
            continue
        if inner == "*":
            for node in current:
                if isinstance(node, list):
                    nxt.extend(node)
                elif isinstance(node, dict):
                    nxt.extend(node.values())
            current = nxt
            continue
        if inner[:1] in "'\"":
            key = inner[1:-1]
            current = [n[key] for n in current if isinstance(n, dict) and key in n]
            continue
        if ":" in inner:
            start_text, _, end_text = inner.partition(":")
            for node in current:
                if isinstance(node, list):
                    start = int(start_text) if start_text.strip() else None
                    end = int(end_text.split(":")[0]) if end_text.split(":")[0].strip() else None
                    nxt.extend(node[start:end])
            current = nxt
            continue
        try:
            index = int(inner)
        except ValueError:
            return []
        for node in current:
            if isinstance(node, list) and -len(node) <= index < len(node):
                nxt.append(node[index])
        current = nxt
    return current
