"""Placeholder: registers nothing until its owner implements it."""

from typing import Any


def register_cli(subparsers: Any) -> None:
    return None
