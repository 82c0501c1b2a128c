"""The ``medallion`` command line: the group and its options in :mod:`~pipelines.app.cli.base`, the
commands by what they do (:mod:`~pipelines.app.cli.pipeline`, :mod:`~pipelines.app.cli.backfill`,
:mod:`~pipelines.app.cli.inspect`,
:mod:`~pipelines.app.cli.tools`, :mod:`~pipelines.app.cli.sql`) and how results look in
:mod:`~pipelines.app.cli.render`."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import click

from pipelines.app.cli import backfill, inspect, pipeline, sql, tools  # noqa: F401  (each registers its commands)
from pipelines.app.cli.base import State, cli, configure_logging, err_console, first_line
from pipelines.errors import MedallionError, SettingsError

__all__ = ["State", "cli", "configure_logging", "main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: one clear line per error and a non-zero exit; ``--verbose`` for the traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args or "--verbose" in args
    try:
        code = cli.main(args=args, prog_name="medallion", standalone_mode=False)
        if isinstance(code, int) and code:  # a command ended with click.exceptions.Exit(code)
            sys.exit(code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.UsageError as exc:  # one line, and where to read more
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        err_console.print(f"error: {exc.format_message()}{hint}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        err_console.print(f"error: {exc.format_message()}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except SettingsError as exc:
        for problem in exc.problems:
            err_console.print(f"error: {problem}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except MedallionError as exc:
        if verbose:
            traceback.print_exc()
        err_console.print(f"error: {exc}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        err_console.print(
            f"error: {type(exc).__name__}: {first_line(exc)} (run with --verbose for the traceback)",
            soft_wrap=True,
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
