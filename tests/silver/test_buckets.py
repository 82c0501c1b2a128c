from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from silver.buckets import BucketMapping, assign_buckets, plan_buckets


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


def skewed_volumes() -> dict[int, int]:
    # Team 1 sends half the traffic; 60 others share the rest unevenly.
    others = {t: 100 + (t * 37) % 400 for t in range(2, 62)}
    return {1: sum(others.values()), **others}


def test_plan_balances_a_skewed_distribution_with_few_moves() -> None:
    volumes = skewed_volumes()
    current = {t: t % 8 for t in volumes}  # team 1 shares bucket 1 with seven others
    plan = plan_buckets(BucketMapping(8), current, volumes, max_moves=12)
    big = plan.after[1]
    rest = [load for b, load in plan.after.items() if b != 1]
    assert big == volumes[1]  # the big team ends alone in its bucket
    assert max(rest) - min(rest) < max(volumes[t] for t in volumes if t != 1)  # within one team's volume
    assert max(plan.before.values()) > max(plan.after.values())
    assert len(plan.moves) <= 12 and all(m.reason == "balance" for m in plan.moves)
    assert 1 not in {m.team for m in plan.moves}  # moving it could not lower the peak
    # Only moved teams become pinned; everyone else keeps the hash bucket.
    assert set(plan.mapping.pinned) == {m.team for m in plan.moves}
    assert sum(plan.after.values()) == sum(volumes.values())


def test_plan_moves_at_most_max_moves_and_keeps_everything_else() -> None:
    volumes = skewed_volumes()
    current = {t: t % 8 for t in volumes}
    plan = plan_buckets(BucketMapping(8), current, volumes, max_moves=3)
    assert len(plan.moves) == 3
    moved = {m.team for m in plan.moves}
    untouched = {t for t in volumes if t not in moved}
    after_assignment = {**current, **{m.team: m.to_bucket for m in plan.moves}}
    assert all(after_assignment[t] == current[t] for t in untouched)


def test_plan_places_tier_teams_only_in_their_reserved_buckets() -> None:
    mapping = BucketMapping(8, tiers={"enterprise": (0, 1)}, team_tiers={10: "enterprise", 11: "enterprise"})
    volumes = {t: 100 for t in range(2, 30)}
    current = {t: t % 8 for t in volumes}  # some enterprise and some other teams are misplaced
    plan = plan_buckets(mapping, current, volumes, max_moves=0)
    final = {**current, **{m.team: m.to_bucket for m in plan.moves}}
    assert final[10] in (0, 1) and final[11] in (0, 1)
    assert all(final[t] not in (0, 1) for t in volumes if t not in (10, 11))
    assert {m.reason for m in plan.moves} == {"tier"}


def test_shrinking_the_bucket_count_pins_every_team() -> None:
    volumes = {t: 10 * t for t in range(1, 20)}
    current = {t: t % 8 for t in volumes}
    plan = plan_buckets(BucketMapping(8), current, volumes, buckets=4, max_moves=0)
    assert plan.mapping.count == 4 and set(plan.mapping.pinned) == set(volumes)
    assert all(0 <= b < 4 for b in plan.mapping.pinned.values())
    assert all(plan.mapping.pinned[t] == current[t] for t in volumes if current[t] < 4)
    assert {m.reason for m in plan.moves} == {"range"}


def test_tiers_in_spark_put_tier_teams_in_reserved_buckets_and_others_outside(spark: SparkSession) -> None:
    mapping = BucketMapping(8, tiers={"enterprise": (6, 7)}, team_tiers={5: "enterprise", 9: "enterprise"})
    teams = spark.range(1, 500).withColumnRenamed("id", "team_id")
    rows = {r["team_id"]: r["bucket"] for r in teams.transform(assign_buckets(mapping)).collect()}
    assert rows[5] in (6, 7) and rows[9] in (6, 7)
    assert all(b not in (6, 7) for t, b in rows.items() if t not in (5, 9))
    assert len({b for t, b in rows.items() if t not in (5, 9)}) == 6
