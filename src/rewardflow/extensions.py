"""Loading the optional C extensions (``rewardflow.client._speedups``, ``rewardflow.events._avrofast``).

``pip install -e .`` builds them when a C compiler and the Python headers are
there (``setup.py``); each has a pure-Python (or fastavro) twin that gives the
same results. ``REWARDFLOW_PURE_PYTHON=1`` (any value but empty or ``0``)
forces the twins, in every process that sees it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_extension(name: str) -> tuple[ModuleType | None, str]:
    """The extension module ``name``, or None and why not (for a one-line status). Never raises."""
    if os.environ.get("REWARDFLOW_PURE_PYTHON", "").strip() not in ("", "0"):
        return None, "REWARDFLOW_PURE_PYTHON is set"
    try:
        return importlib.import_module(name), ""
    except ImportError as exc:
        return None, f"the C extension {name} is not built ({exc})"
