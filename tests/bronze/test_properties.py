"""Property documents, parsed once where the event is: each value's JSON kind and canonical text, by hand."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bronze.properties import DOCUMENT_COLUMNS, JAVASCRIPT, SERDE_JSON, _documents, parse_documents

SCHEMA = "properties string, person_properties string"


def documents(spark: SparkSession, properties: str | None, person: str | None = None) -> dict:
    row = (
        spark.createDataFrame([(properties, person)], SCHEMA)
        .transform(parse_documents())
        .select(*[F.col(c) for c in DOCUMENT_COLUMNS])
        .first()
    )
    assert row is not None
    return {
        c: None if row[c] is None else {k: (v["kind"], v["text"]) for k, v in row[c].items()} for c in DOCUMENT_COLUMNS
    }


def test_each_value_keeps_its_kind_and_canonical_text(spark: SparkSession) -> None:
    props = (
        '{"s":"a \\"q\\" \\u00e9","e":"","n":null,"t":true,"f":false,"i":-0,"big":123456789012345678901234567890,'
        '"d":1.50,"two":2.0,"x":2.5e3,"tiny":1e-7,"o":{"b":1,"a":[2]},"l":[1,"x"]}'
    )
    assert documents(spark, props)["props"] == {
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


def test_person_set_set_once_and_group_set_are_documents_of_their_own(spark: SparkSession) -> None:
    props = '{"$set":{"plan":"pro"},"$set_once":{"first":1},"$group_set":{"name":"Acme"},"k":"v"}'
    got = documents(spark, props, person='{"plan":"free","n":3}')
    assert got == {
        "props": {
            "$set": ("object", '{"plan":"pro"}'),
            "$set_once": ("object", '{"first":1}'),
            "$group_set": ("object", '{"name":"Acme"}'),
            "k": ("string", "v"),
        },
        "person_props": {"plan": ("string", "free"), "n": ("integer", "3")},
        "set_props": {"plan": ("string", "pro")},
        "set_once_props": {"first": ("integer", "1")},
        "group_set_props": {"name": ("string", "Acme")},
    }


def test_text_that_is_not_an_object_gives_no_document(spark: SparkSession) -> None:
    for text in (None, "[1,2]", "not json", '"s"'):
        assert documents(spark, text, person=text) == dict.fromkeys(DOCUMENT_COLUMNS)
    assert documents(spark, '{"$set":"x","$set_once":[1]}')["set_props"] is None


def test_the_document_columns_are_built_once_per_session(spark: SparkSession) -> None:
    # Building them is several hundred JVM calls; every silver run of a session reuses them.
    first = _documents(spark, JAVASCRIPT)
    assert _documents(spark, JAVASCRIPT) is first
    assert _documents(spark, SERDE_JSON) is not first  # one set per notation
