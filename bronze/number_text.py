"""The canonical text of a JSON number in Python, as :func:`bronze.properties.number_text` writes it
in Spark: for the Kafka ingest process, which parses events without Spark.

A fractional number (a fraction or an exponent) is the double it denotes, written from Python's
``repr``, which gives the shortest digits that read back to the same double, as JavaScript's
``String(x)`` and serde_json's ryu do; only the layout of those digits differs between the two
notations. An integer keeps its digits. Importing this module does not import Spark.
"""

from __future__ import annotations

JAVASCRIPT, SERDE_JSON = "javascript", "serde_json"


def _digits(x: float) -> tuple[str, int]:
    """The shortest digits of ``abs(x)`` without leading or trailing zeros, and ``n`` such that
    the value is 0.<digits> x 10^n ("" for zero)."""
    text = repr(abs(x))
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    stripped = digits.lstrip("0")
    n = len(whole) + (int(exponent) if exponent else 0) - (len(digits) - len(stripped))
    return stripped.rstrip("0"), n


def javascript(x: float) -> str:
    """``String(x)`` of a finite double: plain for 1e-6 <= |x| < 1e21, else ``d.ddde±n``; -0 is 0."""
    digits, n = _digits(x)
    k = len(digits)
    if k == 0:
        return "0"
    sign = "-" if x < 0 else ""
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    return f"{sign}{_mantissa(digits)}e{'+' if e >= 0 else '-'}{abs(e)}"


def serde_json(x: float) -> str:
    """serde_json's ``f64`` text (ryu's layout): plain for exponents -5..15, a whole value ending
    ``.0``; else ``d.ddde<n>`` without a ``+``; -0.0 keeps its sign."""
    digits, n = _digits(x)
    k = len(digits)
    sign = "-" if str(x).startswith("-") else ""
    if k == 0:
        return sign + "0.0"
    e = n - 1
    if -5 <= e <= 15 and k <= n:
        return sign + digits + "0" * (n - k) + ".0"
    if 0 <= e <= 15:
        return sign + digits[:n] + "." + digits[n:]
    if -5 <= e < 0:
        return sign + "0." + "0" * -n + digits
    return f"{sign}{_mantissa(digits)}e{e}"


def _mantissa(digits: str) -> str:
    return digits[0] + ("." + digits[1:] if len(digits) > 1 else "")


def fractional_text(x: float, notation: str) -> str:
    """A fractional number's canonical text in ``notation``."""
    return serde_json(x) if notation == SERDE_JSON else javascript(x)
