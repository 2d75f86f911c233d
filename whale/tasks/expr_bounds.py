"""What a plain arithmetic answer may cost sympy: a structural bound on powers, read off the text.

The sympy-scored families of Reasoning Gym (`whale.tasks.rg.SCREENS`) hand an answer to
`parse_expr`, which computes `Integer ** Integer` exactly and may expand powers of sums. An
answer such as `((((9**99)**99)**99)**99)**99` (9 to the power 99**5, a number of 9.5 billion
digits) or `((x+1)**99+1)**99` (a polynomial of 9801 terms with huge coefficients) is a few
dozen characters and stalls the jailed grader until its timeout. `bounded_powers(text)` parses
the expression (the token set `rg.plain_expression` admits: numbers, names, calls of math
functions, `+ - * / ^ ** ( ) = ,`, unary signs, juxtaposition read as a product) and bounds,
for every subexpression, whatever its parenthesization:

- `bits`: the size of its exact value (numerator and denominator bits; a name counts as 1);
  a sum or product adds sizes, a power multiplies the base's size by the exponent's bound;
- `degree`: its polynomial degree in the names (a product adds, a power multiplies);
- `terms`: how many terms its full expansion can have (a sum adds, a product multiplies, the
  k-th power of t terms has at most C(t + k - 1, k)).

An exponent must hold no power and no function call (a tower, `9**exp(9)`), and its value,
bounded by interval arithmetic with every name in [-4, 4] (pi and E included), must be at
most `MAX_EXPONENT` in magnitude; a division by an interval that holds 0 is refused. The
answer passes when every bound stays within `MAX_BITS`, `MAX_DEGREE` and `MAX_TERMS`.

Not covered: costs that are not sizes (sympy's `simplify` on a long, power-free expression
still takes its time; the grader's timeout ends it), and functions of huge arguments, which
sympy keeps unevaluated (`exp(9**99)`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPONENT = 100
MAX_BITS = 1 << 16  # 9**9801 (31k bits) is cheap for sympy; 9**970299 is not
MAX_DEGREE = 1000
MAX_TERMS = 1000  # (x+y+z)**40 has 861; (x+y+z+w)**20, 1771
NAME_BOUND = Fraction(4)  # |x| for an exponent's names: pi and E are below it
_WIDE = 1 << 64  # an exponent's interval ends past this are refused (no honest answer has them)

_TOKEN = re.compile(
    r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)|(?P<name>[A-Za-z][A-Za-z0-9]*)"
    r"|(?P<op>\*\*|[-+*/^()=,]))"
)


class _Refused(Exception):
    """The expression is over a bound, or is not one the bound can read."""


@dataclass(frozen=True)
class _Node:
    kind: str  # "num", "name", "call", "neg", "+", "*", "/", "^"
    args: tuple[_Node, ...] = ()
    value: Fraction | None = None  # of a "num"
    name: str = ""  # of a "call"


@dataclass(frozen=True)
class _Size:
    bits: int
    degree: int
    terms: int
    mag: float  # log2 of |value|, names in [-4, 4]


def bounded_powers(text: str) -> bool:
    """True when `text` parses and every bound of the module docstring holds."""
    try:
        _size(_Parser(text).parse())
    except (_Refused, RecursionError, ZeroDivisionError, OverflowError):
        return False
    return True


# --- parsing ---------------------------------------------------------------------------------


class _Parser:
    """Recursive descent with Python's precedence: `,` < `=` < `+ -` < `* /` (and
    juxtaposition) < unary signs < `^` (right-associative; its exponent may be signed)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        i, text = 0, text.rstrip()
        while i < len(text):
            m = _TOKEN.match(text, i)
            if m is None or m.end() == i:
                raise _Refused(f"unreadable at {i}")
            kind = m.lastgroup
            assert kind is not None
            tok = m.group(kind)
            self.tokens.append((kind, "^" if tok == "**" else tok))
            i = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise _Refused(f"expected {op or 'more'}")
        self.i += 1
        return tok

    def at(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "op" and tok[1] in ops

    def parse(self) -> _Node:
        node = self.sequence()
        if self.peek() is not None:
            raise _Refused("trailing text")
        return node

    def sequence(self) -> _Node:  # `,` and `=` combine their sides as a sum does
        node = self.sum()
        while self.at(",", "="):
            self.take()
            node = _Node("+", (node, self.sum()))
        return node

    def sum(self) -> _Node:
        node = self.product()
        while self.at("+", "-"):
            rhs = self.product() if self.take()[1] == "+" else _Node("neg", (self.product(),))
            node = _Node("+", (node, rhs))
        return node

    def product(self) -> _Node:
        node = self.unary()
        while True:
            if self.at("*", "/"):
                op = self.take()[1]
                node = _Node(op, (node, self.unary()))
            elif (tok := self.peek()) is not None and (tok[0] != "op" or tok[1] == "("):
                node = _Node("*", (node, self.unary()))  # `2x`, `2 (x+1)`: a product
            else:
                return node

    def unary(self) -> _Node:
        if self.at("+", "-"):
            sign = self.take()[1]
            inner = self.unary()
            return _Node("neg", (inner,)) if sign == "-" else inner
        return self.power()

    def power(self) -> _Node:
        base = self.atom()
        if self.at("^"):
            self.take()
            return _Node("^", (base, self.unary()))
        return base

    def atom(self) -> _Node:
        kind, tok = self.take()
        if kind == "num":
            return _Node("num", value=Fraction(tok))
        if kind == "name":
            if self.at("("):
                self.take()
                if self.at(")"):
                    raise _Refused("empty call")
                args = self.sequence()
                self.take(")")
                return _Node("call", (args,), name=tok)
            return _Node("name")
        if tok == "(":
            inner = self.sequence()
            self.take(")")
            return inner
        raise _Refused(f"unexpected {tok!r}")


# --- bounds ----------------------------------------------------------------------------------


_GROWTH = frozenset({"exp", "sinh", "cosh"})  # |f(a)| up to e**|a|
_BOUNDED = frozenset({"sin", "cos", "tanh", "atan", "acot", "asin", "acos"})  # |f(a)| <= 4
_SHRINK = frozenset({"sqrt", "Abs", "abs", "asinh", "acosh"})  # |f(a)| <= |a| + 1
# the others (tan, cot, sec, csc, log, ln, atanh, a log of two arguments) grow near a pole or
# 0 of their argument: as far as a division by it, bounded by its size


def _size(node: _Node) -> _Size:
    """The bounds of `node`, refusing as soon as one is over its limit."""
    if node.kind == "num":
        assert node.value is not None
        v = node.value
        p, q = abs(v.numerator).bit_length(), v.denominator.bit_length()
        out = _Size(p + q + 1, 0, 1, float(p))
    elif node.kind == "name":
        out = _Size(2, 1, 1, 2.0)
    elif node.kind == "neg":
        out = _size(node.args[0])
    elif node.kind == "call":  # one atom of the expansion; its argument is checked on its own
        a = _size(node.args[0])
        out = _Size(a.bits + 1, max(a.degree, 1), 1, _call_mag(node.name, a))
    elif node.kind == "+":
        a, b = (_size(n) for n in node.args)
        out = _Size(a.bits + b.bits + 1, max(a.degree, b.degree), a.terms + b.terms,
                    max(a.mag, b.mag) + 1)  # fmt: skip
    elif node.kind in ("*", "/"):
        a, b = (_size(n) for n in node.args)
        # |a / b|: b is no smaller than what its size can write (2**-bits)
        mag = a.mag + (b.mag if node.kind == "*" else b.bits)
        out = _Size(a.bits + b.bits, a.degree + b.degree, a.terms * b.terms, mag)
    elif node.kind == "^":
        base, exponent = node.args
        k = max(math.ceil(_exponent_bound(exponent)), 1)
        a = _size(base)
        terms = a.terms if a.terms == 1 else math.comb(a.terms + k - 1, k)
        out = _Size(a.bits * k, a.degree * k, terms, max(a.mag, a.bits) * k)  # a**-k: 1/a**k
    else:  # pragma: no cover - the parser makes no other kind
        raise _Refused(node.kind)
    if max(out.bits, out.mag) > MAX_BITS or out.degree > MAX_DEGREE or out.terms > MAX_TERMS:
        raise _Refused("over a bound")
    return out


def _call_mag(name: str, arg: _Size) -> float:
    if name in _GROWTH:
        if arg.mag > 20:  # e**(2**20) is far past MAX_BITS already
            raise _Refused(f"{name} of a value up to 2**{arg.mag:.0f}")
        return math.log2(math.e) * 2.0**arg.mag + 1
    if name in _BOUNDED:
        return 2.0
    if name in _SHRINK:
        return arg.mag + 1
    return float(arg.bits + 2)


def _exponent_bound(node: _Node) -> Fraction:
    lo, hi = _interval(node)
    bound = max(abs(lo), abs(hi))
    if bound > MAX_EXPONENT:
        raise _Refused(f"exponent up to {float(bound):.3g}")
    return bound


def _interval(node: _Node) -> tuple[Fraction, Fraction]:
    """Bounds of an exponent's value; a power or a call in it is refused."""
    if node.kind == "num":
        assert node.value is not None
        out = (node.value, node.value)
    elif node.kind == "name":
        out = (-NAME_BOUND, NAME_BOUND)
    elif node.kind == "neg":
        lo, hi = _interval(node.args[0])
        out = (-hi, -lo)
    elif node.kind == "+":
        (a, b), (c, d) = (_interval(n) for n in node.args)
        out = (a + c, b + d)
    elif node.kind in ("*", "/"):
        (a, b), (c, d) = (_interval(n) for n in node.args)
        if node.kind == "/":
            if c <= 0 <= d:
                raise _Refused("an exponent divides by what may be 0")
            c, d = 1 / d, 1 / c
        products = (a * c, a * d, b * c, b * d)
        out = (min(products), max(products))
    else:
        raise _Refused(f"a {node.kind} in an exponent")
    for end in out:
        if abs(end) > _WIDE or end.denominator > _WIDE:
            raise _Refused("an exponent's value is out of range")
    return out
