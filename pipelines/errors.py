"""Errors a user can meet. Each message says what to do; the CLI prints it as one line."""

from __future__ import annotations


class MedallionError(Exception):
    """Base class: an error with a message meant for the person running the pipeline."""

    exit_code = 1


class SettingsError(MedallionError):
    """One or more settings are invalid; ``problems`` holds one line per bad field."""

    exit_code = 2

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid settings:\n" + "\n".join(f"  {p}" for p in problems))


class JavaNotFoundError(MedallionError):
    """Spark cannot start because no Java runtime is installed or JAVA_HOME is wrong."""

    exit_code = 3


class StorageError(MedallionError):
    """A Delta table operation failed in a way the caller should report, not retry."""


class CommitConflictError(StorageError):
    """Another writer committed first; the caller may re-read and retry."""


class EngineUnavailableError(StorageError):
    """The configured Delta engine cannot run here (for example Delta jars missing from the JVM)."""


class InputError(MedallionError):
    """A file or argument given on the command line cannot be used."""

    exit_code = 2
