"""Filter expressions and templates (docs/transforms.md “Expressions”), compiled once into
Python functions of a message, never interpreted per message.

An expression is a Python expression of a fixed, small grammar, checked node by node before it
is compiled; anything outside it is refused at load with the reason:

- the names ``action``, ``record``, ``changes``, ``metadata`` and ``message`` (the whole
  message, as the previous step left it);
- fields by ``record.status`` or ``record["status"]`` (a list item by ``record.tags[0]``): a
  missing field, or a field of something that is not an object, is ``None``; a name starting
  with ``__`` is refused;
- literals (text, numbers, ``True``, ``False``, ``None``, lists and tuples of them);
- ``and``, ``or``, ``not``, ``x if c else y``; comparisons ``== != < <= > >= in not in is is not``
  (an ordering comparison with ``None`` is false, not an error);
- ``+ - * / // %`` and unary ``-`` on numbers (``+`` also joins text and lists); no ``**``;
- the calls ``len lower upper str int float startswith endswith``.

A template is text with ``{field}`` places (``orders.{record.tenant_id}``, ``{{`` for a brace),
each a field path as above.
"""

from __future__ import annotations

import ast
import io
import itertools
import math
import re
import tokenize
import unicodedata
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from core.redact import Said, said
from core.steps import numbers
from core.steps.payload import dump

NAMES = ("action", "record", "changes", "metadata", "message")
MAX_LENGTH = 4096  # characters of an expression or template
Fields = Callable[[dict[str, Any]], Any]


class ExpressionError(ValueError):
    """An expression or template that cannot be compiled: the message says why and where."""


def _get(v: Any, k: Any) -> Any:
    """A field of an object or an item of a list; None when there is none."""
    if type(v) is dict:
        return v.get(k)
    if type(v) is list and type(k) is int and -len(v) <= k < len(v):
        return v[k]
    return None


_is_num = numbers.is_num


def _num(v: Any, op: str) -> Any:
    if _is_num(v):
        return v
    raise TypeError(said("%s takes numbers, not %s", op, _kind(v)))


def _eq(a: Any, b: Any) -> bool:
    """JSON equality: never across kinds (true is not 1), numbers by value however read; lists
    and objects item by item alike ([true] is not [1]: a tryout)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(v, b[k]) for k, v in a.items())
    if _is_num(a) and _is_num(b):
        x, y = numbers.pair(a, b)
        return bool(x == y)
    return bool(a == b)


def _in(a: Any, b: Any) -> bool:
    """``a in b``: an item of a list (by ``_eq``), a key of an object, a piece of text; in
    null (a missing field), false."""
    if b is None:
        return False
    if isinstance(b, str):
        if not isinstance(a, str):
            raise TypeError(said("in text takes text, not %s", _kind(a)))
        return a in b
    if isinstance(b, dict):
        return isinstance(a, str) and a in b
    if isinstance(b, (list, tuple)):
        return any(_eq(a, x) for x in b)
    raise TypeError(said("in takes a list, an object or text, not %s", _kind(b)))


def _kind(v: Any) -> str:
    if _is_num(v):
        return "a number"
    return {type(None): "null", bool: "true/false", str: "text", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)  # fmt: skip


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return _PLUS(_num(a, "+"), _num(b, "+"))


_PLUS = numbers.arith("+")


def _arith(op: str) -> Callable[[Any, Any], Any]:
    fn = numbers.arith(op)

    def run(a: Any, b: Any) -> Any:
        return fn(_num(a, op), _num(b, op))

    return run


def _order(fn: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def run(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return False
        if _ordered(a) != _ordered(b) or _ordered(a) is None:  # never across kinds
            raise TypeError(said("%s and %s do not compare", _kind(a), _kind(b)))
        return fn(*numbers.pair(a, b)) if _is_num(a) else fn(a, b)

    return run


def _ordered(v: Any) -> str | None:
    """What ``v`` orders among: numbers, texts or true/false; lists and objects do not (their
    items could meet across kinds: [true] < [2])."""
    if isinstance(v, bool):
        return "bool"
    if _is_num(v):
        return "number"
    return "text" if isinstance(v, str) else None


def _text(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(s: Any, *rest: Any) -> Any:
        if type(s) is not str:
            raise TypeError(said("%s takes text, not %s", fn.__name__, _kind(s)))
        return fn(s, *rest)

    return run


def text_of(v: Any) -> str:
    """A value as text: text as it is, anything else as its JSON (``true``, ``1.5``)."""
    if isinstance(v, str):
        return str(v)
    return dump(v).decode()  # numbers as read (an exact one's digits), Decimals as theirs


def _len(v: Any) -> int:
    if isinstance(v, (str, list, dict)):
        return len(v)
    raise TypeError(said("len takes text, a list or an object, not %s", _kind(v)))


def _float(v: Any) -> float:
    made = float(v)  # a number, or text of one
    if not math.isfinite(made):
        raise ValueError(said("float of %s: not a finite number (JSON has no NaN or infinity)",
                              text_of(v)[:40]))  # fmt: skip
    return made


_CALLS: dict[str, Callable[..., Any]] = {
    "len": _len, "str": text_of, "int": lambda v: numbers.whole(_num(v, "int")), "float": _float,
    "lower": _text(str.lower), "upper": _text(str.upper),
    "startswith": _text(str.startswith), "endswith": _text(str.endswith),
}  # fmt: skip
_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "_add", ast.Sub: "_sub", ast.Mult: "_mul", ast.Div: "_div",
    ast.FloorDiv: "_floordiv", ast.Mod: "_mod",
}  # fmt: skip
_ORDERS: dict[type[ast.cmpop], str] = {ast.Lt: "_lt", ast.LtE: "_le", ast.Gt: "_gt",
                                       ast.GtE: "_ge"}  # fmt: skip
_HELPERS: dict[str, Any] = {
    "_get": _get, "_add": _add, "_eq": _eq, "_in": _in,
    "_neg": lambda v: numbers.neg(_num(v, "-")), "_sub": _arith("-"), "_mul": _arith("*"),
    "_div": _arith("/"), "_floordiv": _arith("//"), "_mod": _arith("%"),
    "_lt": _order(lambda a, b: a < b), "_le": _order(lambda a, b: a <= b),
    "_gt": _order(lambda a, b: a > b), "_ge": _order(lambda a, b: a >= b),
    **{f"_call_{k}": v for k, v in _CALLS.items()},
}  # fmt: skip


class _Check(ast.NodeTransformer):
    """Refuses what the grammar does not hold and rewrites the rest into calls of the helpers
    (fields into ``_get``, arithmetic and ordering into null- and type-safe functions)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.literals: dict[str, Decimal] = {}  # a number with a point or an exponent: as written

    def refuse(self, node: ast.AST, why: str) -> ExpressionError:
        col = getattr(node, "col_offset", 0)
        return ExpressionError(
            said("%s at column %s of %r", Said(why), col + 1, self.text)
        )  # why: Weir's words

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, (ast.Expression, ast.BoolOp, ast.UnaryOp, ast.IfExp, ast.Compare,
                                 ast.List, ast.Tuple, ast.Load, ast.And, ast.Or, ast.Not,
                                 ast.USub, ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is,
                                 ast.IsNot, ast.Lt, ast.LtE, ast.Gt, ast.GtE)):  # fmt: skip
            raise self.refuse(node, said("%s is not allowed", type(node).__name__.lower()))
        return super().generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if not isinstance(node.value, (str, int, float, bool, type(None))):
            raise self.refuse(node, said("the literal %r is not allowed", node.value))
        if type(node.value) is float:  # Python would read 1e-400 as 0.0
            written = ast.get_source_segment(self.text, node) or repr(node.value)
            name = f"_number{len(self.literals)}"
            self.literals[name] = Decimal(written)
            return ast.Name(name, ast.Load())
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in NAMES:
            known = Said(", ".join(NAMES))
            raise self.refuse(node, said("unknown name %r (the names are %s)", node.id, known))
        return node

    def _field(self, node: ast.AST, key: ast.expr) -> ast.AST:
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and \
                key.value.startswith("__"):  # fmt: skip
            raise self.refuse(node, said("the field %r is not allowed", key.value))
        return ast.Call(ast.Name("_get", ast.Load()), [self.visit(node.value), key], [])  # type: ignore[attr-defined]

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return self._field(node, ast.Constant(node.attr))

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        key = node.slice
        if not (isinstance(key, ast.Constant) and type(key.value) in (str, int)):
            raise self.refuse(node, "a field is named by a literal text or integer")
        return self._field(node, key)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        name = _BINOPS.get(type(node.op))
        if name is None:
            raise self.refuse(node, said("the operator %s is not allowed", type(node.op).__name__))
        return ast.Call(ast.Name(name, ast.Load()), [self.visit(node.left),
                                                     self.visit(node.right)], [])  # fmt: skip

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, ast.USub):
            return ast.Call(ast.Name("_neg", ast.Load()), [self.visit(node.operand)], [])
        if isinstance(node.op, ast.Not):
            return self.generic_visit(node)
        raise self.refuse(node, said("the operator %s is not allowed", type(node.op).__name__))

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        """A chain ``a < b < c`` is ``a < b and b < c``; ordering goes through the helpers;
        ``is`` only compares with None."""
        terms = [self.visit(node.left), *(self.visit(c) for c in node.comparators)]
        parts: list[ast.expr] = []
        for op, (a, b) in zip(node.ops, itertools.pairwise(terms), strict=True):
            if isinstance(op, (ast.Is, ast.IsNot)) and not (
                isinstance(b, ast.Constant) and b.value is None
            ):
                raise self.refuse(node, "`is` compares with None only")
            if (name := _ORDERS.get(type(op))) is not None:
                parts.append(ast.Call(ast.Name(name, ast.Load()), [a, b], []))
            elif isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):  # JSON's rules
                helper = "_eq" if isinstance(op, (ast.Eq, ast.NotEq)) else "_in"
                call = ast.Call(ast.Name(helper, ast.Load()), [a, b], [])
                yes = isinstance(op, (ast.Eq, ast.In))
                parts.append(call if yes else ast.UnaryOp(ast.Not(), call))
            else:
                parts.append(ast.Compare(a, [op], [b]))
        return parts[0] if len(parts) == 1 else ast.BoolOp(ast.And(), parts)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _CALLS or node.keywords:
            known = Said(" ".join(_CALLS))
            raise self.refuse(node, said("calls are %s with plain arguments", known))
        return ast.Call(ast.Name(f"_call_{name}", ast.Load()), [self.visit(a) for a in node.args],
                        [])  # fmt: skip


def _names(text: str) -> list[str]:
    """The names of an expression that parsed, as written (not inside its texts)."""
    tokens = tokenize.generate_tokens(io.StringIO(text.strip()).readline)
    return [t.string for t in tokens if t.type == tokenize.NAME and not t.string.isascii()]


def _parse(text: str) -> ast.Expression:
    if len(text) > MAX_LENGTH:
        raise ExpressionError(said("an expression is at most %s characters", MAX_LENGTH))
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(said("%s at column %s of %r", e.msg, e.offset or 0, text)) from None
    for word in _names(text):  # Python reads a name as its NFKC form: maybe another field
        if (folded := unicodedata.normalize("NFKC", word)) != word:
            raise ExpressionError(said("the name %r reads as %r (Python folds names): write it "
                                       "as a key, ['%s']", word, folded, Said(word)))  # fmt: skip
    return tree


def _function(body: ast.expr, text: str, literals: dict[str, Decimal]) -> Callable[..., Any]:
    """``lambda action, record, changes, metadata, message: body`` with only the helpers in
    reach (no builtins)."""
    args = ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in NAMES], kwonlyargs=[],
                         kw_defaults=[], defaults=[])  # fmt: skip
    tree = ast.fix_missing_locations(ast.Expression(ast.Lambda(args, body)))
    try:
        code = compile(tree, f"<expression {text!r}>", "eval")
    except (ValueError, RecursionError, MemoryError, SyntaxError) as e:  # nesting too deep
        raise ExpressionError(said("%r cannot be compiled: %s", text, e)) from None
    made: Callable[..., Any] = eval(code, {"__builtins__": {}, **_HELPERS, **literals})
    return made


def expression(text: str) -> Callable[..., Any]:
    """The function of (action, record, changes, metadata, message) an expression is."""
    tree, check = _parse(text), _Check(text)
    try:
        body = check.visit(tree).body
    except RecursionError:
        raise ExpressionError(said("%r… is nested too deeply", text[:40])) from None
    return _function(body, text, check.literals)


def path(text: str) -> Callable[..., Any]:
    """A field path (``record.customer.id``, ``metadata["table_name"]``) as a function of the
    message's parts; anything but a path is refused."""
    tree = _parse(text)
    node: ast.AST = tree.body
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    if not isinstance(node, ast.Name):
        raise ExpressionError(said("%r is not a field path (such as record.tenant_id)", text))
    return expression(text)


_PLACE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def template(text: str) -> tuple[list[str], list[Callable[..., Any]]]:
    """A template's literal pieces and the field functions between them: ``n`` fields come
    with ``n + 1`` pieces (``pieces[0] + str(field0) + pieces[1] + …``)."""
    pieces, fields, at, buf = [], [], 0, []
    for m in _PLACE.finditer(text):
        buf.append(text[at : m.start()])
        at = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            buf.append(token[0])
        elif m.group(1) is None:
            raise ExpressionError(
                said("a lone %r in the template %r (write it twice)", token, text)
            )
        else:
            pieces.append("".join(buf))
            buf = []
            fields.append(path(m.group(1)))
    buf.append(text[at:])
    pieces.append("".join(buf))
    return pieces, fields
