"""A property value's kind and canonical text, from the value itself and its JSON text, by hand."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bronze.properties import value_kind, value_text


def values(spark: SparkSession, properties: str) -> dict[str, tuple[str, str | None]]:
    """Each entry of a JSON object -> (its kind, its canonical text)."""
    entries = spark.createDataFrame([(properties,)], "properties string").select(
        F.explode(F.try_variant_get(F.parse_json("properties"), "$", "map<string,variant>")).alias("key", "v")
    )
    json = F.to_json("v")
    rows = entries.select("key", value_kind(json, F.col("v")).alias("kind"), value_text(json, F.col("v")).alias("text"))
    return {r["key"]: (r["kind"], r["text"]) for r in rows.collect()}


def test_each_value_has_its_kind_and_canonical_text(spark: SparkSession) -> None:
    props = (
        '{"s":"a \\"q\\" \\u00e9","e":"","n":null,"t":true,"f":false,"i":-0,"big":123456789012345678901234567890,'
        '"d":1.50,"two":2.0,"x":2.5e3,"tiny":1e-7,"o":{"b":1,"a":[2]},"l":[1,"x"]}'
    )
    assert values(spark, props) == {
        "s": ("string", 'a "q" é'),
        "e": ("string", ""),
        "n": ("null", None),
        "t": ("boolean", "true"),
        "f": ("boolean", "false"),
        "i": ("integer", "0"),
        "big": ("number", "123456789012345678901234567890"),
        "d": ("number", "1.5"),
        "two": ("number", "2"),
        "x": ("number", "2500"),
        "tiny": ("number", "1e-7"),
        "o": ("object", '{"a":[2],"b":1}'),
        "l": ("array", '[1,"x"]'),
    }


def test_a_string_is_its_own_text_whatever_it_looks_like(spark: SparkSession) -> None:
    # A string that reads as a number, a boolean or an object keeps its text: only numbers are rewritten.
    props = '{"a":"1.0","b":"2.5e3","c":"true","d":"{\\"x\\": 1}","e":"null","f":"-0"}'
    assert values(spark, props) == {
        "a": ("string", "1.0"),
        "b": ("string", "2.5e3"),
        "c": ("string", "true"),
        "d": ("string", '{"x": 1}'),
        "e": ("string", "null"),
        "f": ("string", "-0"),
    }
