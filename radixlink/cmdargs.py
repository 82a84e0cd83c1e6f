"""Argparse helpers every command module shares (``radixlink demo|bench|store``): a parser
whose errors are one-line ``UsageError``s, and ``type`` callables for bounded numbers.

Owns argument parsing only. Must not import a command (the commands import this; ``cli``
dispatches to them), so dependencies point one way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


class UsageError(ValueError):
    """A command-line mistake; printed as one line, exit status 2."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise ``UsageError`` (one line) instead of printing
    the usage block and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting ints >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {value}")
        return value

    return parse


def number_in(
    low: float, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite floats in ``[low, high]`` (``(low, high]`` with
    ``low_open``); the ranges are ``stores.params.number``'s."""
    from radixlink.stores.params import number  # NOTE: one range check for URLs and flags

    check = number(low, high, low_open=low_open)
    allowed = f"{'>' if low_open else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")

    def parse(text: str) -> float:
        try:
            return check(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {allowed}, got {text!r}") from None

    return parse
