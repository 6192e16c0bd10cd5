"""Placeholder, replaced by its owner."""


def command() -> None:
    """Not built yet."""
    raise SystemExit("not built yet")
