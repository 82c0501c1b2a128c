"""A property value's kind and canonical text, from the value itself (a VARIANT of the event's own
parse) and its JSON text as Spark writes it.

Gold's fan-out (:mod:`gold.property_values`) and the counters read every value of an event's
``properties``, ``person_properties``, ``$set``, ``$set_once`` and ``$group_set`` through these:

- the *kind* of a value is its JSON kind: ``string``, ``integer`` (a number written without
  fraction or exponent that fits 64 bits), ``number`` (any other number), ``boolean``, ``null``,
  ``object`` or ``array``;
- its *text* is its canonical text: a string as it is, a number in the one text every way of writing
  it shares (see ``number_text``), ``true`` / ``false``, an object or array as compact JSON with
  sorted keys, and null for ``null``.

They are column expressions of native functions (no Python UDF), evaluated in generated code.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from bronze.primitives import INTEGER_TYPES

STRING, INTEGER, NUMBER, BOOLEAN, NULL, OBJECT, ARRAY = (
    "string",
    "integer",
    "number",
    "boolean",
    "null",
    "object",
    "array",
)
NESTED_KINDS = (OBJECT, ARRAY)

#: How numbers are written (``bronze.number_notation``): JavaScript's ``String(x)``, or serde_json's
#: ``Value::to_string()`` as PostHog's property-vals-rs writes a property value.
JAVASCRIPT, SERDE_JSON = "javascript", "serde_json"

#: Shortest round-trip digits of a double (Schubfach), in Java's notation; jackson-core ships with
#: Spark. Java 17's own Double.toString is not always the shortest.
SHORTEST_DOUBLE = "com.fasterxml.jackson.core.io.schubfach.DoubleToDecimal"

#: The JSON text of an integer, as Spark writes a BIGINT or a DECIMAL of scale 0.
_INTEGER_TEXT = r"^-?[0-9]+$"
#: A plain decimal of at most 21 integer digits (|x| < 1e21, where JavaScript writes plain digits).
_PLAIN_DECIMAL = r"^-?[0-9]{1,21}[.][0-9]+$"
#: Under 1e-6 in magnitude, where JavaScript switches to an exponent.
_UNDER_MICRO = r"^-?0[.]0{6}"
#: A plain decimal of at most 16 integer digits (|x| < 1e16, where serde_json writes plain digits).
_SERDE_PLAIN_DECIMAL = r"^-?[0-9]{1,16}[.][0-9]+$"
#: Under 1e-5 in magnitude (and not zero), where serde_json switches to an exponent.
_SERDE_UNDER = r"^-?0[.]0{5}"
#: The largest integer serde_json reads as a u64 and writes back digit for digit (larger: a double).
_I64_MAX, _U64_MAX = str(2**63 - 1), str(2**64 - 1)


def number_text(value: Column, notation: str = JAVASCRIPT) -> Column:
    """The canonical text of a JSON number held in a VARIANT (null for anything else).

    - An integer keeps all its digits: ``-0`` is ``0``, 2^53+1 stays ``9007199254740993``, and
      ``100.0`` is ``100``. That is every number Spark holds exactly with no fraction (BIGINT, or
      DECIMAL with scale 0, up to 38 digits); an exponent or more digits make it a double.
    - Any other number is the double it denotes, written as JavaScript's ``String(x)`` (and
      ``JSON.stringify``) writes it: the shortest digits that read back to the same double, plain
      for 1e-6 <= |x| < 1e21, else ``d.ddde±n``. So ``1.0`` is ``1``, ``2.5e3`` ``2500``,
      ``1e21`` ``1e+21``, ``1e16`` ``10000000000000000``, ``1.25e-5`` ``0.0000125``,
      ``0.000001`` ``0.000001``, ``1e-7`` ``1e-7``.

    With ``notation="serde_json"`` the same double is written as serde_json writes an ``f64``
    (ryu's layout): plain for 1e-5 <= |x| < 1e16 with ``.0`` on a whole value, else ``d.ddden``
    with no ``+``; ``-0.0`` keeps its sign. So ``1.0`` is ``1.0``, ``1e5`` ``100000.0``,
    ``0.000001`` ``1e-6``, ``1e16`` ``1e16``, ``1e21`` ``1e21``. An integer keeps its digits
    where serde_json reads it as a u64 or an i64 (-2^63 .. 2^64-1) and is a double past that.

    Built from native functions: Schubfach's shortest digits (via ``reflect``) re-laid-out with
    string functions, no Python UDF. ``property_value`` takes a faster path first and calls this
    only for the numbers that path cannot write.
    """
    kind = F.schema_of_variant(value)
    if notation == SERDE_JSON:
        is_integer = _serde_integer(kind, F.to_json(value))
    else:
        is_integer = kind.isin(*INTEGER_TYPES) | kind.endswith(",0)")
    integer = F.when(is_integer, F.to_json(value))
    double = F.try_variant_get(value, "$", "double")
    java = F.reflect(F.lit(SHORTEST_DOUBLE), F.lit("toString"), double)  # e.g. -1.25E-5, 2500.0
    parts = r"^-?([0-9]+)\.([0-9]+)(?:E(-?[0-9]+))?$"
    whole, fraction = F.regexp_extract(java, parts, 1), F.regexp_extract(java, parts, 2)
    exponent = F.coalesce(F.regexp_extract(java, parts, 3).try_cast("int"), F.lit(0))
    digits = F.concat(whole, fraction)
    leading = F.length(digits) - F.length(F.regexp_replace(digits, "^0+", ""))
    significant = F.regexp_replace(F.regexp_replace(digits, "^0+", ""), "0+$", "")
    k = F.length(significant)
    n = F.length(whole) + exponent - leading  # the value is 0.<significant> x 10^n
    if notation == SERDE_JSON:
        sign = F.when(java.startswith("-"), F.lit("-")).otherwise(F.lit(""))
        laid_out = _serde_layout(significant, k, n)
    else:
        sign = F.when(java.startswith("-") & (k > 0), F.lit("-")).otherwise(F.lit(""))
        laid_out = _javascript_layout(significant, k, n)
    finite = F.when(whole != "", F.concat(sign, laid_out)).otherwise(java)  # else Infinity, -Infinity
    # Java writes at least two digits, and for a subnormal the closest two can beat d.0 (5e-324
    # is 4.9E-324): where one digit reads back to the same double, that one is the shortest. Both
    # notations write a subnormal as d e-n. (A branch of its own: the layouts above reference their
    # digits many times, and a column is a tree, not a graph, so rewriting the digits would copy it.)
    one_digit = F.format_string("%.0e", double)
    subnormal = (F.abs(double) < F.lit(2.2250738585072014e-308)) & (double != 0) & (one_digit.cast("double") == double)
    finite = F.when(subnormal, F.regexp_replace(one_digit, "e-0*", "e-")).otherwise(finite)
    fractional = kind.isin("DOUBLE", "FLOAT") | kind.startswith("DECIMAL")
    return F.coalesce(integer, F.when(fractional, finite))


def _javascript_layout(significant: Column, k: Column, n: Column) -> Column:
    """JavaScript's layout of the digits ``significant`` (``k`` of them) of 0.<significant> x 10^n."""
    e = n - 1
    return (
        F.when(k == 0, F.lit("0"))
        .when((k <= n) & (n <= 21), F.concat(significant, F.repeat(F.lit("0"), n - k)))
        .when((n > 0) & (n <= 21), _point_inside(significant, n))
        .when((n > -6) & (n <= 0), _leading_zeros(significant, n))
        .otherwise(
            F.concat(
                _mantissa(significant, k),
                F.lit("e"),
                F.when(e >= 0, F.lit("+")).otherwise(F.lit("-")),
                F.abs(e).cast("string"),
            )
        )
    )


def _serde_layout(significant: Column, k: Column, n: Column) -> Column:
    """serde_json's (ryu's ``format64``) layout of the digits of 0.<significant> x 10^n: plain for
    exponents -5..15, a whole value ending ``.0``; else ``d.ddde-n`` / ``d.dddEn`` without a ``+``."""
    e = n - 1
    return (
        F.when(k == 0, F.lit("0.0"))
        .when((e >= -5) & (e <= 15) & (k <= n), F.concat(significant, F.repeat(F.lit("0"), n - k), F.lit(".0")))
        .when((e >= 0) & (e <= 15), _point_inside(significant, n))
        .when((e >= -5) & (e < 0), _leading_zeros(significant, n))
        .otherwise(F.concat(_mantissa(significant, k), F.lit("e"), e.cast("string")))
    )


def _point_inside(significant: Column, n: Column) -> Column:
    """``d..d.d..d``: the point after the first ``n`` digits (0 < n < number of digits)."""
    return F.concat(F.substr(significant, F.lit(1), n), F.lit("."), F.substr(significant, n + 1))


def _leading_zeros(significant: Column, n: Column) -> Column:
    """``0.0..0d..d``: ``-n`` zeros after the point, then the digits (n <= 0)."""
    return F.concat(F.lit("0."), F.repeat(F.lit("0"), -n), significant)


def _mantissa(significant: Column, k: Column) -> Column:
    """``d`` or ``d.d..d``: the digits with the point after the first, for an exponent form."""
    return F.concat(
        F.substr(significant, F.lit(1), F.lit(1)),
        F.when(k > 1, F.concat(F.lit("."), F.substr(significant, F.lit(2)))).otherwise(F.lit("")),
    )


def _serde_integer(kind: Column, text: Column) -> Column:
    """Whether serde_json read this number as an integer (and writes its digits back as they are).

    A number written without fraction or exponent that fits 64 bits Spark holds as a BIGINT; one
    past a BIGINT, as a DECIMAL of scale 0, which serde_json reads as a u64 up to 2^64-1. Spark
    also holds ``2.0`` as a DECIMAL of scale 0, but such a number fits a BIGINT: it is a double."""

    def above(digits: str) -> Column:  # text > digits, both unsigned integers without leading zeros
        return (F.length(text) > len(digits)) | ((F.length(text) == len(digits)) & (text > F.lit(digits)))

    u64_only = kind.endswith(",0)") & ~text.startswith("-") & above(_I64_MAX) & ~above(_U64_MAX)
    return kind.isin(*INTEGER_TYPES) | u64_only


def value_kind(json: Column, value: Column) -> Column:
    """The kind of a value from its JSON text and the value (a VARIANT)."""
    first = F.substring(json, 1, 1)
    return (
        F.when(first == '"', F.lit(STRING))
        .when(first == "n", F.lit(NULL))
        .when(first == "{", F.lit(OBJECT))
        .when(first == "[", F.lit(ARRAY))
        .when(first.isin("t", "f"), F.lit(BOOLEAN))
        # Spark holds 2.0 as DECIMAL(1,0): its text is 2, but only an integer type was written so.
        .when(F.schema_of_variant(value).isin(*INTEGER_TYPES), F.lit(INTEGER))
        .otherwise(F.lit(NUMBER))
    )


def value_text(json: Column, value: Column, notation: str = JAVASCRIPT) -> Column:
    """The canonical text of one value, from its JSON text and the value itself.

    A plain decimal of at most 15 significant digits is the shortest text of the double it
    denotes (any two such decimals denote different doubles), so it only loses trailing zeros
    (and, in serde_json's notation, keeps ``.0`` on a whole value); Schubfach (``number_text``)
    runs only for the other fractional numbers.

    """
    first = F.substring(json, 1, 1)
    significant = F.regexp_replace(F.regexp_replace(json, "[-.]", ""), "^0+|0+$", "")
    if notation == SERDE_JSON:
        integer = json.rlike(_INTEGER_TEXT) & _serde_integer(F.schema_of_variant(value), json)
        integer_text = json
        short_decimal = json.rlike(_SERDE_PLAIN_DECIMAL) & (F.length(significant) <= 15) & ~json.rlike(_SERDE_UNDER)
        decimal_text = F.regexp_replace(F.regexp_replace(json, "0+$", ""), "[.]$", ".0")
    else:
        integer = json.rlike(_INTEGER_TEXT)
        integer_text = F.when(json == "-0", F.lit("0")).otherwise(json)
        short_decimal = json.rlike(_PLAIN_DECIMAL) & (F.length(significant) <= 15) & ~json.rlike(_UNDER_MICRO)
        trimmed = F.regexp_replace(F.regexp_replace(json, "0+$", ""), "[.]$", "")
        decimal_text = F.when(trimmed == "-0", F.lit("0")).otherwise(trimmed)
    return (
        F.when(
            first == '"',
            # Spark escapes only quotes, backslashes and control characters: no backslash, no escape.
            F.when(~json.contains("\\"), F.substring(json, F.lit(2), F.length(json) - 2)).otherwise(
                F.try_variant_get(value, "$", "string")
            ),
        )
        .when(first == "n", F.lit(None).cast("string"))
        .when(first.isin("{", "[", "t", "f"), json)
        .when(integer, integer_text)
        .when(short_decimal, decimal_text)
        .otherwise(number_text(value, notation))
    )


def negative_zero(key: Column, json: Column, raw: Column) -> Column:
    """Whether a zero was written ``-0`` or ``-0.0`` in the raw text (serde_json writes ``-0.0``).

    Spark's VARIANT holds such a number as the integer or decimal zero, without its sign, so the
    raw text is asked, and only for a zero: the key, quoted as written (a key that JSON escapes is
    not found, and keeps ``0``), followed by a negative zero token."""
    pattern = F.concat(F.lit('"\\Q'), key, F.lit('\\E"\\s*:\\s*-0(?:\\.0*)?(?:[eE][-+]?[0-9]+)?\\s*[,}\\]]'))
    plain_key = ~key.contains('"') & ~key.contains("\\")
    return json.rlike("^0([.]0+)?$") & plain_key & F.regexp_like(raw, pattern)
