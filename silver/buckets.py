"""Team buckets: a stable team -> bucket mapping so downstream work can be split per bucket.

Teams pinned in the mapping keep their bucket; every other team gets ``pmod(xxhash64(team_id),
count)``, which never changes while the bucket count stays the same. Only a mapping change moves
a team.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "teams": {int(k): int(v) for k, v in sorted(self.pinned.items())},
            "tiers": {k: list(v) for k, v in sorted(self.tiers.items())},
            "team_tiers": {int(k): v for k, v in sorted(self.team_tiers.items())},
        }


def hash_bucket(team_id: Column, count: int) -> Column:
    """The bucket a team gets when it is not pinned."""
    return F.pmod(F.xxhash64(team_id.cast("bigint")), F.lit(count)).cast("int")


def bucket_of(team_id: Column, mapping: BucketMapping) -> Column:
    """Pinned bucket if the mapping names the team, else its hash bucket."""
    default = hash_bucket(team_id, mapping.count)
    if not mapping.pinned:
        return default
    pins = F.create_map(*[F.lit(x) for kv in sorted(mapping.pinned.items()) for x in kv])
    return F.coalesce(F.element_at(pins, team_id.cast("bigint")).cast("int"), default)


def assign_buckets(mapping: BucketMapping, team_col: str = "team_id") -> Callable[[DataFrame], DataFrame]:
    """Adds the ``bucket`` column."""

    def transform(df: DataFrame) -> DataFrame:
        return df.withColumn(BUCKET, bucket_of(F.col(team_col), mapping))

    return transform
