"""Settings -> what the layers are configured with: fan-out rules, the bucket mapping, the counter registry.

The layers take plain values and small config objects; this is where the settings and the files
they name become those objects, and where a layer's ConfigError becomes a SettingsError with the
same lines. Jobs, quality gates and queries all import from here, so none imports another for them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gold.counters import Counter, Registry, RegistryError, load_registry
from gold.property_values import FanoutRules, TeamFilter
from pipelines.config.settings import Settings
from pipelines.errors import SettingsError
from silver.buckets import BucketMapping


def fanout_rules(settings: Settings) -> FanoutRules:
    g = settings.gold
    return FanoutRules(g.max_key_length, g.max_value_length, tuple(g.excluded_keys), g.nested_values)


def team_filter(settings: Settings) -> TeamFilter:
    t = settings.gold.teams
    return TeamFilter(tuple(t.allow), tuple(t.block), t.rollout_percent)


def bucket_mapping(settings: Settings) -> BucketMapping:
    """The mapping file named in settings, or hash-only buckets when none is set."""
    cfg = settings.buckets
    if cfg.mapping_file is None:
        return BucketMapping(cfg.count)
    path = Path(cfg.mapping_file)
    if not path.is_file():
        raise SettingsError([f"MEDALLION_BUCKETS__MAPPING_FILE: {str(path)!r} does not exist"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return BucketMapping.from_dict(data, cfg.count)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError) as exc:
        raise SettingsError([f"MEDALLION_BUCKETS__MAPPING_FILE: {str(path)!r} is not a valid mapping: {exc}"]) from exc


def load_counter_registry(path: Path) -> Registry:
    """The registry file at ``path``; every problem is one line of a SettingsError."""
    try:
        return load_registry(path)
    except RegistryError as exc:
        raise SettingsError(exc.problems) from None


def counter_registry(settings: Settings) -> Registry | None:
    path = settings.counters.registry
    return load_counter_registry(path) if path is not None else None


def counter(registry: Registry, name: str) -> Counter:
    """The counter called ``name``, else a SettingsError naming the registry's counters."""
    try:
        return registry.get(name)
    except RegistryError as exc:
        raise SettingsError(exc.problems) from None
