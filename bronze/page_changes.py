"""MediaWiki ``mediawiki.page_change.v1`` events (schema ``/mediawiki/page/change/1.x``), landed raw.

Silver needs the key ``(wiki_id, page_id)``, the revision, the kind of change and the event
time (``dt``); the rest of the event stays in ``raw``.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from bronze.landing import (
    LANDING_COLUMNS,
    LANDING_FIELDS,
    PARSED,
    RAW,
    REASON,
    envelope_checks,
    first_failure,
    json_type,
    with_parsed_json,
)
from bronze.primitives import INTEGER_TYPES

KIND = "page_changes"
PAGE_CHANGE_KINDS = ("create", "edit", "move", "delete", "undelete", "visibility_change")

PAGE_CHANGE_FIELDS = [
    StructField("wiki_id", StringType()),
    StructField("page_id", LongType()),
    StructField("rev_id", LongType()),
    StructField("page_change_kind", StringType()),
    StructField("changelog_kind", StringType()),
    StructField("event_time", TimestampType()),
    StructField("page_title", StringType()),
    StructField("namespace_id", IntegerType()),
    StructField("meta_id", StringType()),
]
BRONZE_PAGE_CHANGES_SCHEMA = StructType([*PAGE_CHANGE_FIELDS, StructField(RAW, StringType()), *LANDING_FIELDS])
BRONZE_PAGE_CHANGES_COLUMNS = [f.name for f in BRONZE_PAGE_CHANGES_SCHEMA.fields]

_REQUIRED = {
    "wiki_id": ("$.wiki_id", ("STRING",), "a string"),
    "page.page_id": ("$.page.page_id", INTEGER_TYPES, "an integer"),
    "revision.rev_id": ("$.revision.rev_id", INTEGER_TYPES, "an integer"),
    "page_change_kind": ("$.page_change_kind", ("STRING",), "a string"),
    "dt": ("$.dt", ("STRING",), "a string"),
}


def parse_page_changes(max_bytes: int) -> Callable[[DataFrame], DataFrame]:
    """Landing rows -> rows with the page-change fields, ``raw`` and a ``reason`` (null when valid)."""

    def transform(df: DataFrame) -> DataFrame:
        df = df.transform(with_parsed_json())
        v = F.col(PARSED)
        kind = F.try_variant_get(v, "$.page_change_kind", "string")
        dt = F.try_to_timestamp(F.try_variant_get(v, "$.dt", "string"))
        checks = envelope_checks(max_bytes)
        for name, (path, _, _) in _REQUIRED.items():
            t = json_type(v, path)
            checks.append((t.isNull() | (t == "VOID"), f"missing required field {name!r}"))
        for name, (path, types, what) in _REQUIRED.items():
            checks.append((~json_type(v, path).isin(*types), f"field {name!r} is not {what}"))
        checks += [
            (~kind.isin(*PAGE_CHANGE_KINDS), F.format_string("unknown page_change_kind %s", kind)),
            (dt.isNull(), "field 'dt' is not an ISO-8601 time"),
        ]
        return df.select(
            F.col("value"),
            F.try_variant_get(v, "$.wiki_id", "string").alias("wiki_id"),
            F.try_variant_get(v, "$.page.page_id", "bigint").alias("page_id"),
            F.try_variant_get(v, "$.revision.rev_id", "bigint").alias("rev_id"),
            kind.alias("page_change_kind"),
            F.try_variant_get(v, "$.changelog_kind", "string").alias("changelog_kind"),
            dt.alias("event_time"),
            F.try_variant_get(v, "$.page.page_title", "string").alias("page_title"),
            F.try_variant_get(v, "$.page.namespace_id", "int").alias("namespace_id"),
            F.try_variant_get(v, "$.meta.id", "string").alias("meta_id"),
            F.col(RAW),
            *LANDING_COLUMNS,
            first_failure(checks).alias(REASON),
        )

    return transform
