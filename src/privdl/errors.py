"""User-facing errors: one clear line, exit code 2 at the CLI."""

from __future__ import annotations


class PrivdlError(Exception):
    """Bad input or an impossible request. The CLI prints ``error: <message>`` and exits with 2.

    Raise it with a single-line message that says what is wrong and how to fix it.
    """


class ConfigError(PrivdlError, ValueError):
    """Invalid configuration value or unknown key."""


class GraphError(PrivdlError, ValueError):
    """Invalid graph specification or a graph that lacks a required property."""


class DataError(PrivdlError):
    """Missing, corrupt or invalid dataset files."""


class PrivacyError(PrivdlError, ValueError):
    """Invalid privacy parameters (sigma <= 0, delta outside (0, 1), q >= n, ...)."""


class ReportedError(PrivdlError):
    """An error another process has already printed (a distributed run's rank 0, or its ranks):
    the CLI exits with 2 and prints nothing more, so the user reads each error once."""


def out_of_range() -> tuple[type[BaseException], ...]:
    """Errors of finite but extreme values that passed validation (overflow, division by zero,
    memory; numpy's LinAlgError only where numpy was imported): the CLI and ``privdl serve``
    answer them with one line, not a traceback."""
    import sys

    errors: tuple[type[BaseException], ...] = (
        OverflowError,
        ZeroDivisionError,
        FloatingPointError,
        MemoryError,
    )
    np = sys.modules.get("numpy")
    return (*errors, np.linalg.LinAlgError) if np is not None else errors
