"""Numbers in steps' expressions (docs/transforms.md “Expressions”), by the value their digits
say, whichever way they were read: two whole numbers are Python ints; any other
pair is two Decimals, a float by its shortest digits (as JSON writes it), a number read exactly
(``Exact``: more digits than a double holds) by its own. So a result never hangs on how a
number was read (a double, or exactly because another field of the payload needed it), and a
literal in an expression is taken as written (``1e-400``, ``12345678901234567890.1``).

``+``, ``-``, ``*``, ``//`` and ``%`` are exact (``//`` rounds down, as Python's does), and
a result of more than 4,300 digits is an error, not rounded (Python's own limit for an int
written as text; a product of large numbers would take seconds a message); ``/`` gives 34
significant digits (IEEE decimal128).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    Context,
    Decimal,
    DecimalException,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
)
from typing import Any

from core.redact import said
from core.steps.payload import Exact

DIGITS = 4300  # a result's digits at most
_BITS = 14_285  # bits of an int of DIGITS digits, about
_EXACT = Context(prec=DIGITS, Emax=MAX_EMAX, Emin=MIN_EMIN,
                 traps=[InvalidOperation, DivisionByZero, Overflow, Inexact])  # fmt: skip
_DIVIDE = Context(prec=34, Emax=MAX_EMAX, Emin=MIN_EMIN)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal)) and not isinstance(v, bool)


def decimal(v: Any) -> Decimal:
    if type(v) is Exact:
        return Decimal(v.text)
    return Decimal(repr(v)) if isinstance(v, float) else Decimal(v)


def pair(a: Any, b: Any) -> tuple[Any, Any]:
    """Two numbers of one kind: two ints as they are, else two Decimals."""
    if isinstance(a, int) and isinstance(b, int):
        return a, b
    return decimal(a), decimal(b)


def neg(v: Any) -> Any:
    if isinstance(v, int):
        return -v
    try:
        return _EXACT.minus(decimal(v))
    except DecimalException:  # a number read with more digits than DIGITS
        raise _too_long("-") from None


def _too_long(op: str) -> ArithmeticError:
    return ArithmeticError(said("%s: the result has more than %s digits", op, DIGITS))


def whole(v: Any) -> int:
    """``int(v)``: toward zero, from its digits (not through a double)."""
    if isinstance(v, int):
        return int(v)
    d = decimal(v)
    if not d.is_finite() or d.adjusted() >= DIGITS:
        raise ValueError(said("int of %s: not a whole number of at most %s digits", d,
                              DIGITS))  # fmt: skip
    return int(d)


def _floor(a: Decimal, b: Decimal) -> Decimal:
    q = _EXACT.divide_int(a, b)  # toward zero
    if (a < 0) != (b < 0) and _EXACT.multiply(q, b) != a:
        q -= 1
    return q


_DECIMAL_OPS: dict[str, Callable[[Decimal, Decimal], Decimal]] = {
    "+": _EXACT.add, "-": _EXACT.subtract, "*": _EXACT.multiply, "/": _DIVIDE.divide,
    "//": _floor, "%": lambda a, b: _EXACT.subtract(a, _EXACT.multiply(_floor(a, b), b)),
}  # fmt: skip
_INT_OPS: dict[str, Callable[[int, int], Any]] = {
    "+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__,
    "%": int.__mod__,
}  # fmt: skip


def arith(op: str) -> Callable[[Any, Any], Any]:
    """The function of two numbers ``op`` is: ints stay ints (``/`` excepted), else Decimals;
    a division by zero fails as Python's does."""
    by_ints, by_decimals = _INT_OPS.get(op), _DECIMAL_OPS[op]

    def run(a: Any, b: Any) -> Any:
        x, y = pair(a, b)
        if op in ("/", "//", "%") and y == 0:
            raise ZeroDivisionError(said("%s by zero", op))
        if by_ints is not None and isinstance(x, int):
            if op == "*" and x.bit_length() + y.bit_length() > _BITS + 1:  # not even made:
                raise _too_long(op)  # a product of large numbers takes seconds
            made = by_ints(x, y)
            if made.bit_length() > _BITS:
                raise _too_long(op)
            return made
        try:
            return by_decimals(decimal(x), decimal(y))
        except DecimalException:  # 1 + 1e-5000, 1e999999 // 3: more digits than DIGITS
            raise _too_long(op) from None

    return run
