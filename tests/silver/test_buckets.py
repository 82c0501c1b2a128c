from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from silver.buckets import BucketMapping, assign_buckets


def test_hash_buckets_are_stable_and_in_range(spark: SparkSession) -> None:
    teams = spark.range(1, 2001).withColumnRenamed("id", "team_id")
    first = teams.transform(assign_buckets(BucketMapping(8)))
    again = teams.transform(assign_buckets(BucketMapping(8)))
    assertDataFrameEqual(first, again)
    assert first.where("bucket < 0 or bucket >= 8").count() == 0
    # Known values pin the hash: a change of hash function would move every team.
    assertDataFrameEqual(
        first.where("team_id in (1, 2, 3)"),
        spark.createDataFrame([(1, 2), (2, 5), (3, 3)], "team_id long, bucket int"),
    )
    counts = [r["count"] for r in first.groupBy("bucket").count().collect()]
    assert len(counts) == 8 and max(counts) < 1.3 * min(counts)


def test_pinned_teams_keep_their_bucket(spark: SparkSession) -> None:
    teams = spark.createDataFrame([(1,), (2,), (3,)], "team_id long")
    out = teams.transform(assign_buckets(BucketMapping(8, pinned={2: 0, 3: 5})))
    assertDataFrameEqual(out, spark.createDataFrame([(1, 2), (2, 0), (3, 5)], "team_id long, bucket int"))


def test_mapping_rejects_buckets_out_of_range_and_unknown_tiers() -> None:
    with pytest.raises(ValueError, match=r"team 4 is pinned to bucket 9, outside 0\.\.7"):
        BucketMapping(8, pinned={4: 9})
    with pytest.raises(ValueError, match="tier 'gold'"):
        BucketMapping(8, team_tiers={4: "gold"})
