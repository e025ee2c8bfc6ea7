"""Exceptions that carry a message for the user (exit code 2, one line, no traceback)."""


class UsageError(Exception):
    """Bad input from the user. The message says what is wrong and what to do instead."""


class NotSupportedError(UsageError):
    """Input we understand but cannot model faithfully (we refuse rather than guess)."""
