"""A subset of CEL for CRD ``x-kubernetes-validations`` rules.

Supported: literals (int, uint, double, string, bytes-free, bool, null, lists, maps), ``self`` and
``oldSelf``, field selection and indexing, ``! - * / % + - < <= > >= == != in && || ?:``,
``has()``, ``size()`` (also as a method), the string methods ``startsWith``, ``endsWith``,
``contains``, ``matches``, ``lowerAscii``, ``upperAscii``, ``trim``, the conversions ``int()``,
``uint()``, ``double()``, ``string()``, ``bool()``, and the macros ``all``, ``exists``, ``exists_one``,
``map``, ``filter``. Anything else (timestamps, durations, quantities, optionals, ``type()``...) makes
:func:`compile_rule` raise :class:`CelUnsupported`: ``schema`` then skips the rule (and the server
warns when the CRD is written) rather than reject objects a real API server would accept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class CelUnsupported(Exception):  # noqa: N818 - names the condition, as CelError does
    """The rule uses CEL this evaluator does not implement."""


class CelError(Exception):
    """Evaluation failed (no such key, bad types): the rule counts as failed, with this message."""


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0x[0-9a-fA-F]+u?|\d+u?)|
    (?P<str>[rR]?(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'))|
    (?P<id>[A-Za-z_][A-Za-z0-9_]*)|
    (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
    )""",
    re.VERBOSE,
)

Node = tuple[Any, ...]


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CelUnsupported(f"cannot parse CEL near {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
    tokens.append(("eof", ""))
    return tokens


def _unquote(literal: str) -> str:
    raw = literal[0] in "rR"
    body = literal[2:-1] if raw else literal[1:-1]
    if raw:
        return body
    return re.sub(
        r"\\(.)",
        lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}.get(
            m.group(1), m.group(0)
        ),
        body,
    )


_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_FUNCTIONS = {"size", "int", "uint", "double", "string", "bool", "has"}
_METHODS = {"size", "startsWith", "endsWith", "contains", "matches", "lowerAscii", "upperAscii", "trim"}


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos]

    def next(self) -> tuple[str, str]:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def accept(self, value: str) -> bool:
        if self.peek()[1] == value and self.peek()[0] in ("op", "id"):
            self.pos += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.accept(value):
            raise CelUnsupported(f"expected {value!r}, found {self.peek()[1]!r}")

    def parse(self) -> Node:
        node = self.conditional()
        if self.peek()[0] != "eof":
            raise CelUnsupported(f"unexpected {self.peek()[1]!r}")
        return node

    def conditional(self) -> Node:
        cond = self.or_()
        if self.accept("?"):
            a = self.conditional()
            self.expect(":")
            b = self.conditional()
            return ("cond", cond, a, b)
        return cond

    def or_(self) -> Node:
        node = self.and_()
        while self.accept("||"):
            node = ("or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.relation()
        while self.accept("&&"):
            node = ("and", node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.additive()
        while self.peek()[1] in ("<", "<=", ">", ">=", "==", "!=", "in"):
            op = self.next()[1]
            node = ("bin", op, node, self.additive())
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while self.peek()[1] in ("+", "-") and self.peek()[0] == "op":
            op = self.next()[1]
            node = ("bin", op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self.peek()[1] in ("*", "/", "%") and self.peek()[0] == "op":
            op = self.next()[1]
            node = ("bin", op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.accept("!"):
            return ("not", self.unary())
        if self.peek() == ("op", "-"):
            self.next()
            return ("neg", self.unary())
        return self.member()

    def args(self) -> list[Node]:
        items: list[Node] = []
        if self.accept(")"):
            return items
        while True:
            items.append(self.conditional())
            if self.accept(")"):
                return items
            self.expect(",")

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                kind, name = self.next()
                if kind != "id":
                    raise CelUnsupported(f"unexpected {name!r} after '.'")
                if self.accept("("):
                    if name in _MACROS:
                        var_kind, var = self.next()
                        if var_kind != "id":
                            raise CelUnsupported("macro variable expected")
                        self.expect(",")
                        body = self.conditional()
                        self.expect(")")
                        node = ("macro", name, node, var, body)
                    elif name in _METHODS:
                        node = ("method", name, node, self.args())
                    else:
                        raise CelUnsupported(f"method {name}() is not supported")
                else:
                    node = ("select", node, name)
            elif self.accept("["):
                index = self.conditional()
                self.expect("]")
                node = ("index", node, index)
            else:
                return node

    def primary(self) -> Node:
        kind, value = self.next()
        if kind == "num":
            if value.endswith("u"):
                return ("lit", int(value[:-1], 0))
            if any(c in value for c in ".eE") and not value.startswith("0x"):
                return ("lit", float(value))
            return ("lit", int(value, 0))
        if kind == "str":
            return ("lit", _unquote(value))
        if kind == "id":
            if value in ("true", "false"):
                return ("lit", value == "true")
            if value == "null":
                return ("lit", None)
            if self.accept("("):
                if value not in _FUNCTIONS:
                    raise CelUnsupported(f"function {value}() is not supported")
                args = self.args()
                if value == "has":
                    if len(args) != 1 or args[0][0] != "select":
                        raise CelUnsupported("has() takes a field selection")
                    return ("has", args[0][1], args[0][2])
                return ("call", value, args)
            return ("ident", value)
        if value == "(":
            node = self.conditional()
            self.expect(")")
            return node
        if value == "[":
            items: list[Node] = []
            if not self.accept("]"):
                while True:
                    items.append(self.conditional())
                    if self.accept("]"):
                        break
                    self.expect(",")
            return ("list", items)
        if value == "{":
            entries: list[tuple[Node, Node]] = []
            if not self.accept("}"):
                while True:
                    k = self.conditional()
                    self.expect(":")
                    entries.append((k, self.conditional()))
                    if self.accept("}"):
                        break
                    self.expect(",")
            return ("map", entries)
        raise CelUnsupported(f"unexpected {value!r}")


@dataclass(frozen=True)
class Program:
    source: str
    ast: Node
    uses_old_self: bool

    def evaluate(self, variables: dict[str, Any]) -> Any:
        return _eval(self.ast, variables)


def _mentions(node: Any, name: str) -> bool:
    if isinstance(node, tuple):
        if node == ("ident", name):
            return True
        return any(_mentions(child, name) for child in node)
    if isinstance(node, list):
        return any(_mentions(child, name) for child in node)
    return False


def compile_rule(source: str) -> Program:
    ast = _Parser(source).parse()
    return Program(source, ast, _mentions(ast, "oldSelf"))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def _equal(a: Any, b: Any) -> bool:
    if _kind(a) != _kind(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _compare(op: str, a: Any, b: Any) -> bool:
    if _kind(a) != _kind(b) or _kind(a) not in ("number", "str", "bool"):
        raise CelError(f"no such overload: {_kind(a)} {op} {_kind(b)}")
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "<": lambda x, y: x < y,
        "<=": lambda x, y: x <= y,
        ">": lambda x, y: x > y,
        ">=": lambda x, y: x >= y,
    }
    return ops[op](a, b)


def _eval(node: Node, env: dict[str, Any]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "ident":
        if node[1] not in env:
            raise CelError(f"undeclared reference to '{node[1]}'")
        return env[node[1]]
    if tag == "select":
        target = _eval(node[1], env)
        if not isinstance(target, dict) or node[2] not in target:
            raise CelError(f"no such key: {node[2]}")
        return target[node[2]]
    if tag == "has":
        target = _eval(node[1], env)
        return isinstance(target, dict) and node[2] in target
    if tag == "index":
        target = _eval(node[1], env)
        index = _eval(node[2], env)
        try:
            return target[index]
        except (KeyError, IndexError, TypeError) as exc:
            raise CelError(f"no such key or index: {index!r}") from exc
    if tag == "not":
        value = _eval(node[1], env)
        if not isinstance(value, bool):
            raise CelError("no such overload: !" + _kind(value))
        return not value
    if tag == "neg":
        value = _eval(node[1], env)
        if _kind(value) != "number":
            raise CelError("no such overload: -" + _kind(value))
        return -value
    if tag in ("and", "or"):
        decisive = tag == "or"
        error: CelError | None = None
        for child in node[1:]:
            try:
                value = _eval(child, env)
            except CelError as exc:
                error = exc
                continue
            if not isinstance(value, bool):
                raise CelError(f"no such overload: {tag} on {_kind(value)}")
            if value is decisive:
                return decisive
        if error is not None:
            raise error
        return not decisive
    if tag == "cond":
        cond = _eval(node[1], env)
        if not isinstance(cond, bool):
            raise CelError("conditional needs a bool")
        return _eval(node[2] if cond else node[3], env)
    if tag == "list":
        return [_eval(item, env) for item in node[1]]
    if tag == "map":
        return {_eval(k, env): _eval(v, env) for k, v in node[1]}
    if tag == "bin":
        return _binary(node[1], _eval(node[2], env), _eval(node[3], env))
    if tag == "call":
        return _call(node[1], [_eval(a, env) for a in node[2]])
    if tag == "method":
        target = _eval(node[2], env)
        return _method(node[1], target, [_eval(a, env) for a in node[3]])
    if tag == "macro":
        return _macro(node[1], _eval(node[2], env), node[3], node[4], env)
    raise CelError(f"unknown node {tag}")


def _binary(op: str, a: Any, b: Any) -> Any:
    if op == "==":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    if op in ("<", "<=", ">", ">="):
        return _compare(op, a, b)
    if op == "in":
        if isinstance(b, list):
            return any(_equal(a, x) for x in b)
        if isinstance(b, dict):
            return a in b
        raise CelError("no such overload: in " + _kind(b))
    if op == "+":
        if _kind(a) == _kind(b) and _kind(a) in ("number", "str", "list"):
            return a + b
        raise CelError(f"no such overload: {_kind(a)} + {_kind(b)}")
    if _kind(a) != "number" or _kind(b) != "number":
        raise CelError(f"no such overload: {_kind(a)} {op} {_kind(b)}")
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise CelError("division by zero")
        if isinstance(a, int) and isinstance(b, int):
            return int(a / b)
        return a / b
    if op == "%":
        if b == 0:
            raise CelError("modulus by zero")
        return int(a - b * int(a / b))
    raise CelError(f"unknown operator {op}")


def _call(name: str, args: list[Any]) -> Any:
    if len(args) != 1:
        raise CelError(f"{name}() takes one argument")
    (value,) = args
    try:
        if name == "size":
            return _size(value)
        if name in ("int", "uint"):
            return int(value)
        if name == "double":
            return float(value)
        if name == "string":
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)
        if name == "bool":
            if isinstance(value, str):
                return value in ("true", "True", "TRUE", "t", "1")
            return bool(value)
    except (TypeError, ValueError) as exc:
        raise CelError(str(exc)) from exc
    raise CelError(f"unknown function {name}")


def _size(value: Any) -> int:
    if isinstance(value, str | list | dict):
        return len(value)
    raise CelError("no such overload: size(" + _kind(value) + ")")


def _method(name: str, target: Any, args: list[Any]) -> Any:
    if name == "size":
        return _size(target)
    if not isinstance(target, str):
        raise CelError(f"no such overload: {_kind(target)}.{name}()")
    if name in ("lowerAscii", "upperAscii", "trim"):
        return {"lowerAscii": target.lower, "upperAscii": target.upper, "trim": target.strip}[name]()
    if len(args) != 1 or not isinstance(args[0], str):
        raise CelError(f"{name}() takes one string")
    arg = args[0]
    if name == "startsWith":
        return target.startswith(arg)
    if name == "endsWith":
        return target.endswith(arg)
    if name == "contains":
        return arg in target
    if name == "matches":
        return re.search(arg, target) is not None
    raise CelError(f"unknown method {name}")


def _macro(name: str, target: Any, var: str, body: Node, env: dict[str, Any]) -> Any:
    if isinstance(target, dict):
        items = list(target.keys())
    elif isinstance(target, list):
        items = target
    else:
        raise CelError(f"{name}() needs a list or map")

    def run(item: Any) -> Any:
        return _eval(body, {**env, var: item})

    if name == "all":
        return all(_truth(run(i)) for i in items)
    if name == "exists":
        return any(_truth(run(i)) for i in items)
    if name == "exists_one":
        return sum(1 for i in items if _truth(run(i))) == 1
    if name == "map":
        return [run(i) for i in items]
    if name == "filter":
        return [i for i in items if _truth(run(i))]
    raise CelError(f"unknown macro {name}")


def _truth(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError("predicate must be bool")
    return value
