"""Team buckets: a stable team -> bucket mapping so downstream work can be split per bucket.

Teams pinned in the mapping keep their bucket; every other team gets ``pmod(xxhash64(team_id),
count)``, which never changes while the bucket count stays the same. Only a mapping change moves
a team.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

BUCKET = "bucket"


@dataclass(frozen=True)
class BucketMapping:
    """``count`` buckets; ``pinned`` team -> bucket; ``tiers`` name -> reserved buckets;
    ``team_tiers`` team -> tier name."""

    count: int
    pinned: Mapping[int, int] = field(default_factory=dict)
    tiers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    team_tiers: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.count < 1:
            problems.append(f"bucket count must be at least 1, got {self.count}")
        for team, bucket in self.pinned.items():
            if not 0 <= bucket < self.count:
                problems.append(f"team {team} is pinned to bucket {bucket}, outside 0..{self.count - 1}")
        for tier, buckets in self.tiers.items():
            bad = [b for b in buckets if not 0 <= b < self.count]
            if bad or not buckets:
                problems.append(f"tier {tier!r} reserves buckets {list(buckets)}, outside 0..{self.count - 1}")
        for team, tier in self.team_tiers.items():
            if tier not in self.tiers:
                problems.append(f"team {team} has tier {tier!r}, which reserves no buckets")
        if self.tiers and not self.unreserved:
            problems.append("tiers reserve every bucket: leave at least one for teams without a tier")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], default_count: int) -> BucketMapping:
        """Read ``{count, teams: {team: bucket}, tiers: {name: [buckets]}, team_tiers: {team: name}}``."""
        return cls(
            count=int(data.get("count", default_count)),
            pinned={int(k): int(v) for k, v in (data.get("teams") or {}).items()},
            tiers={str(k): tuple(int(b) for b in v) for k, v in (data.get("tiers") or {}).items()},
            team_tiers={int(k): str(v) for k, v in (data.get("team_tiers") or {}).items()},
        )

    @property
    def reserved(self) -> frozenset[int]:
        return frozenset(b for buckets in self.tiers.values() for b in buckets)

    @property
    def unreserved(self) -> tuple[int, ...]:
        """Buckets teams without a tier may use (all of them when no tier reserves any)."""
        return tuple(b for b in range(self.count) if b not in self.reserved)

    def pool(self, team: int) -> tuple[int, ...]:
        """The buckets ``team`` may be placed in: its tier's, or the unreserved ones."""
        tier = self.team_tiers.get(team)
        return tuple(sorted(self.tiers[tier])) if tier else self.unreserved

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "teams": {int(k): int(v) for k, v in sorted(self.pinned.items())},
            "tiers": {k: list(v) for k, v in sorted(self.tiers.items())},
            "team_tiers": {int(k): v for k, v in sorted(self.team_tiers.items())},
        }


def hash_bucket(team_id: Column, count: int) -> Column:
    """The bucket a team gets when nothing pins it and no tier reserves buckets."""
    return F.pmod(F.xxhash64(team_id.cast("bigint")), F.lit(count)).cast("int")


def _pick(buckets: Column, team_id: Column) -> Column:
    # One of ``buckets`` chosen by the team's hash: stable while the list stays the same.
    return F.element_at(buckets, (F.pmod(F.xxhash64(team_id.cast("bigint")), F.size(buckets)) + 1).cast("int"))


def bucket_of(team_id: Column, mapping: BucketMapping) -> Column:
    """Pinned bucket if the mapping names the team; else a hash over its pool of buckets (its
    tier's reserved buckets, or the unreserved ones). Without tiers that is ``hash mod count``."""
    if not mapping.tiers:
        default = hash_bucket(team_id, mapping.count)
    else:
        unreserved = F.array(*[F.lit(b) for b in mapping.unreserved])
        default = _pick(unreserved, team_id)
        if mapping.team_tiers:
            pools = F.create_map(
                *[
                    x
                    for team, tier in sorted(mapping.team_tiers.items())
                    for x in (F.lit(team), F.array(*[F.lit(b) for b in sorted(mapping.tiers[tier])]))
                ]
            )
            tiered = F.element_at(pools, team_id.cast("bigint"))
            default = F.when(tiered.isNotNull(), _pick(tiered, team_id)).otherwise(default)
    if not mapping.pinned:
        return default.cast("int")
    pins = F.create_map(*[F.lit(x) for kv in sorted(mapping.pinned.items()) for x in kv])
    return F.coalesce(F.element_at(pins, team_id.cast("bigint")).cast("int"), default.cast("int"))


def assign_buckets(mapping: BucketMapping, team_col: str = "team_id") -> Callable[[DataFrame], DataFrame]:
    """Adds the ``bucket`` column."""

    def transform(df: DataFrame) -> DataFrame:
        return df.withColumn(BUCKET, bucket_of(F.col(team_col), mapping))

    return transform


def in_buckets(buckets: Sequence[int] | None) -> Callable[[DataFrame], DataFrame]:
    """Keeps the rows of ``buckets`` (every row when None or empty)."""

    def transform(df: DataFrame) -> DataFrame:
        return df if not buckets else df.where(F.col(BUCKET).isin(*buckets))

    return transform


@dataclass(frozen=True)
class Move:
    team: int
    from_bucket: int
    to_bucket: int
    volume: int
    reason: str  # balance | tier | range


@dataclass(frozen=True)
class BucketPlan:
    mapping: BucketMapping
    moves: list[Move]
    before: dict[int, int]  # bucket -> volume
    after: dict[int, int]


def _loads(assignment: Mapping[int, int], volumes: Mapping[int, int], count: int) -> dict[int, int]:
    loads = dict.fromkeys(range(count), 0)
    for team, bucket in assignment.items():
        loads[bucket] = loads.get(bucket, 0) + volumes.get(team, 0)
    return loads


def _required_moves(
    target: BucketMapping, assignment: dict[int, int], volumes: Mapping[int, int], loads: dict[int, int]
) -> list[Move]:
    """Teams outside their pool or beyond the bucket count, largest first, each moved to the least
    loaded bucket of its pool (``assignment`` and ``loads`` are updated)."""
    moves = []
    for team in sorted(assignment, key=lambda t: (-volumes[t], t)):
        pool = target.pool(team)
        bucket = assignment[team]
        if bucket in pool:
            continue
        dest = min(pool, key=lambda b: (loads[b], b))
        if bucket < target.count:
            loads[bucket] -= volumes[team]
        loads[dest] += volumes[team]
        assignment[team] = dest
        moves.append(Move(team, bucket, dest, volumes[team], "range" if bucket >= target.count else "tier"))
    return moves


def _balance_moves(
    target: BucketMapping, assignment: dict[int, int], volumes: Mapping[int, int], loads: dict[int, int], max_moves: int
) -> list[Move]:
    """Up to ``max_moves`` teams moved, largest imbalance first: from the most loaded bucket of a
    pool to its least loaded, the team whose volume best halves the gap (``assignment`` and
    ``loads`` are updated)."""
    pools = {tuple(sorted(target.tiers[t])) for t in target.tiers} | {target.unreserved}
    moves: list[Move] = []
    while len(moves) < max_moves:
        best: tuple[int, tuple[int, ...]] | None = None
        for pool in pools:
            hi, lo = max(pool, key=lambda b: (loads[b], -b)), min(pool, key=lambda b: (loads[b], b))
            gap = loads[hi] - loads[lo]
            if gap > 0 and (best is None or gap > best[0]):
                best = (gap, pool)
        if best is None:
            break
        gap, pool = best
        hi, lo = max(pool, key=lambda b: (loads[b], -b)), min(pool, key=lambda b: (loads[b], b))
        candidates = [t for t, b in assignment.items() if b == hi and 0 < volumes[t] < gap]
        if not candidates:
            pools.discard(pool)  # nothing in its fullest bucket can move without making it worse
            if not pools:
                break
            continue
        team = max(candidates, key=lambda t: (min(volumes[t], gap - volumes[t]), -t))
        loads[hi] -= volumes[team]
        loads[lo] += volumes[team]
        assignment[team] = lo
        moves.append(Move(team, hi, lo, volumes[team], "balance"))
    return moves


def plan_buckets(
    mapping: BucketMapping,
    current: Mapping[int, int],
    volumes: Mapping[int, int],
    *,
    buckets: int | None = None,
    max_moves: int = 10,
) -> BucketPlan:
    """A new mapping that balances ``volumes`` over the buckets while keeping assignments.

    ``current`` is each team's bucket today. Teams outside their pool (a tier's reserved buckets,
    or the unreserved ones) or beyond a reduced bucket count must move and always do; then up to
    ``max_moves`` teams move, largest imbalance first: from the most loaded bucket of a pool to its
    least loaded, choosing the team whose volume best halves the gap, while that lowers the peak.
    Every team that moves, and every team already pinned, is pinned in the new mapping; when the
    bucket count changes all teams are pinned, so none moves by the hash changing.
    """
    count = buckets or mapping.count
    target = BucketMapping(count, dict(mapping.pinned), dict(mapping.tiers), dict(mapping.team_tiers))
    assignment = {t: b for t, b in current.items() if t in volumes}
    before = _loads(assignment, volumes, max(count, mapping.count))
    loads = _loads({t: b for t, b in assignment.items() if b < count}, volumes, count)
    moves = _required_moves(target, assignment, volumes, loads)
    moves += _balance_moves(target, assignment, volumes, loads, max_moves)
    pinned = dict(target.pinned)
    for m in moves:
        pinned[m.team] = m.to_bucket
    if count != mapping.count:
        pinned.update(assignment)
    new_mapping = BucketMapping(count, pinned, dict(target.tiers), dict(target.team_tiers))
    return BucketPlan(new_mapping, moves, before, _loads(assignment, volumes, count))
