"""Checks: a Great Expectations expectation with a name, a default policy and, for row-level checks,
the SQL predicate a passing row satisfies.

The predicate is built from the same arguments as the expectation, by the same helper, so the rows
``drop`` removes are the rows GX counts as unexpected (a test holds every helper to that). Checks on
the whole batch (uniqueness, sums, queries over several rows) cannot drop rows: a ``drop`` policy
on one is a settings error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, get_args

from bronze.primitives import ConfigError

if TYPE_CHECKING:
    from great_expectations.expectations.expectation import Expectation

Policy = Literal["warn", "drop", "fail"]
POLICIES: tuple[str, ...] = get_args(Policy)


class PolicyError(ConfigError):
    """Policy settings that cannot apply to a suite; ``problems`` holds one line per setting."""


@dataclass(frozen=True)
class Expects:
    """A GX expectation by its class name and arguments, built when a validation first asks GX for
    it. Importing Great Expectations takes 3.5-4 CPU-seconds: a process whose checks Spark or
    Arrow count (every batch gate of a pass) reads the kind and the arguments here instead, and a
    process that validates nothing (``--version``, a refused argument) does not pay it either."""

    kind: str  # a class of ``great_expectations.expectations``
    arguments: tuple[tuple[str, Any], ...]

    def get(self, name: str, default: Any = None) -> Any:
        """An argument as given (``default`` when not given: pass GX's default where it matters)."""
        return dict(self.arguments).get(name, default)

    def build(self) -> Expectation:
        import great_expectations.expectations as gxe

        return getattr(gxe, self.kind)(**dict(self.arguments))


def expects(kind: str, **arguments: Any) -> Expects:
    return Expects(kind, tuple(arguments.items()))


@dataclass(frozen=True)
class Check:
    """One expectation of a suite, by name."""

    name: str
    expects: Expects
    policy: Policy
    description: str
    passes: str | None = None  # SQL predicate true for a passing row; None for checks on the whole batch
    on: Literal["rows", "figures"] = "rows"  # the table's rows, or one row of figures from several tables
    # "table": only when validating whole tables, for checks a batch satisfies by construction
    # (the output of a GROUP BY is unique on its keys) but a table can lose (a MERGE gone wrong);
    # "batch": only on the batches a gate checks, for a column the table it lands in does not hold.
    scope: Literal["batch", "table", "both"] = "both"
    #: For a check on a total of the batch: the SQL aggregate (its observed value) and the range it
    #: must lie in (inclusive; None: unbounded), computed with the row-level counts instead of by GX.
    total: str | None = None
    total_between: tuple[int | None, int | None] = (None, None)

    @cached_property
    def expectation(self) -> Expectation:
        return self.expects.build()

    @property
    def row_level(self) -> bool:
        return self.passes is not None

    def total_holds(self, value: int) -> bool:
        low, high = self.total_between
        return (low is None or value >= low) and (high is None or value <= high)


@dataclass(frozen=True)
class Suite:
    """The checks of one table (``layer/name``), in order."""

    table: str
    checks: tuple[Check, ...]

    def names(self) -> list[str]:
        return [c.name for c in self.checks]

    def for_batches(self) -> Suite:
        """The checks a gate runs on each batch before it is written."""
        return Suite(self.table, tuple(c for c in self.checks if c.scope != "table"))

    def for_tables(self) -> Suite:
        """The checks ``medallion validate`` runs on the whole table (a batch's own are left out)."""
        return Suite(self.table, tuple(c for c in self.checks if c.scope != "batch"))

    def with_policies(self, policies: Mapping[str, str]) -> Suite:
        """This suite with policies from settings: ``table`` sets every check, ``table:check`` one."""
        problems = policy_problems(self, policies)
        if problems:
            raise PolicyError(problems)
        checks = []
        for check in self.checks:
            policy = policies.get(f"{self.table}:{check.name}")
            if policy is None:
                whole = policies.get(self.table)
                # A table-wide "drop" applies to the checks that can drop; the others keep their own.
                policy = whole if whole is not None and (whole != "drop" or check.row_level) else check.policy
            checks.append(replace(check, policy=policy))  # type: ignore[arg-type]
        return Suite(self.table, tuple(checks))


def policy_problems(suite: Suite, policies: Mapping[str, str]) -> list[str]:
    """Lines naming each policy setting for ``suite`` that cannot apply, for a PolicyError."""
    problems = []
    by_name = {c.name: c for c in suite.checks}
    for key, policy in policies.items():
        table, _, name = key.partition(":")
        if table != suite.table:
            continue
        where = f"MEDALLION_QUALITY__POLICIES[{key!r}]"
        if policy not in POLICIES:
            problems.append(f"{where}: {policy!r} is not a policy; use one of {', '.join(POLICIES)}")
        elif name and name not in by_name:
            problems.append(f"{where}: {suite.table} has no expectation {name!r}; it has {', '.join(by_name)}")
        elif name and policy == "drop" and not by_name[name].row_level:
            problems.append(f"{where}: {name} checks the whole batch, so it cannot drop rows; use warn or fail")
    return problems


def _q(column: str) -> str:
    return f"`{column}`"


def _sql(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


# -- checks on single rows (droppable) ------------------------------------------------------------
def not_null(column: str, policy: Policy = "drop", name: str | None = None) -> Check:
    return Check(
        name or f"{column}_not_null",
        expects("ExpectColumnValuesToNotBeNull", column=column),
        policy,
        f"{column} is not null",
        f"{_q(column)} IS NOT NULL",
    )


def between(
    column: str,
    low: float | None = None,
    high: float | None = None,
    policy: Policy = "drop",
    name: str | None = None,
) -> Check:
    """``low <= column <= high`` (either bound optional); nulls pass, as in GX."""
    bounds = [f"{_q(column)} >= {low!r}"] if low is not None else []
    bounds += [f"{_q(column)} <= {high!r}"] if high is not None else []
    text = " and ".join(b.replace("`", "") for b in bounds)
    return Check(
        name or f"{column}_in_range",
        expects("ExpectColumnValuesToBeBetween", column=column, min_value=low, max_value=high),
        policy,
        text,
        f"{_q(column)} IS NULL OR ({' AND '.join(bounds)})",
    )


def in_set(column: str, values: Sequence[Any], policy: Policy = "drop", name: str | None = None) -> Check:
    """``column`` is one of ``values``; nulls pass, as in GX."""
    return Check(
        name or f"{column}_known",
        expects("ExpectColumnValuesToBeInSet", column=column, value_set=list(values)),
        policy,
        f"{column} in {{{', '.join(map(str, values))}}}",
        f"{_q(column)} IS NULL OR {_q(column)} IN ({', '.join(_sql(v) for v in values)})",
    )


def not_in_set(column: str, values: Sequence[Any], policy: Policy = "drop", name: str | None = None) -> Check:
    """``column`` is none of ``values``; nulls pass, as in GX."""
    return Check(
        name or f"{column}_allowed",
        expects("ExpectColumnValuesToNotBeInSet", column=column, value_set=list(values)),
        policy,
        f"{column} not in {{{', '.join(map(str, values))}}}",
        f"{_q(column)} IS NULL OR {_q(column)} NOT IN ({', '.join(_sql(v) for v in values)})",
    )


def at_least_column(a: str, b: str, policy: Policy = "drop", name: str | None = None) -> Check:
    """``a >= b`` on every row where both are set."""
    return Check(
        name or f"{a}_not_before_{b}",
        expects(
            "ExpectColumnPairValuesAToBeGreaterThanB",
            column_A=a,
            column_B=b,
            or_equal=True,
            ignore_row_if="either_value_is_missing",
        ),
        policy,
        f"{a} >= {b}",
        f"{_q(a)} IS NULL OR {_q(b)} IS NULL OR {_q(a)} >= {_q(b)}",
    )


# -- checks on the whole batch --------------------------------------------------------------------
def unique(
    columns: Sequence[str], name: str, policy: Policy = "fail", scope: Literal["batch", "table", "both"] = "both"
) -> Check:
    """No two rows share ``columns``; rows with a null among them are not compared (file-landed
    bronze rows have no Kafka offsets)."""
    expectation = (
        expects("ExpectColumnValuesToBeUnique", column=columns[0])
        if len(columns) == 1
        else expects("ExpectCompoundColumnsToBeUnique", column_list=list(columns), ignore_row_if="any_value_is_missing")
    )
    return Check(name, expectation, policy, f"one row per ({', '.join(columns)})", scope=scope)


def sum_equals(column: str, value: int, name: str, what: str, policy: Policy = "fail") -> Check:
    return Check(
        name,
        expects("ExpectColumnSumToBeBetween", column=column, min_value=value, max_value=value),
        policy,
        f"sum({column}) == {what} ({value:,})",
        total=f"coalesce(sum({_q(column)}), 0)",
        total_between=(value, value),
    )


def no_rows(name: str, query: str, description: str, policy: Policy = "fail") -> Check:
    """``query`` (over ``{batch}``) returns no row; its rows are the failures."""
    return Check(
        name,
        expects("UnexpectedRowsExpectation", unexpected_rows_query=query, description=description),
        policy,
        description,
    )


def figures_equal(a: str, b: str, name: str, description: str, policy: Policy = "fail") -> Check:
    """Figure ``a`` == figure ``b``, on the one-row frame of figures computed from several tables."""
    return Check(
        name, expects("ExpectColumnPairValuesToBeEqual", column_A=a, column_B=b), policy, description, on="figures"
    )
