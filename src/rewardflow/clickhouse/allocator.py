"""How the embedded engine's allocator returns freed memory, set before this process loads chDB.

chDB allocates through its own jemalloc, built to keep freed pages for 5 s
(``dirty_decay_ms:5000``) before it gives them back to the system. A
long-running owner of the engine (``rewardflow run``) frees hundreds of MB a
second in merges and inserts, and with that decay those pages stay resident on top of what
the engine uses. rewardflow starts the engine with a decay of
:data:`DIRTY_DECAY_MS` instead: in a merge benchmark the peak fell from ~680
to ~490 MB for about 5 % more CPU (``dirty_decay_ms:0``, returning every page
at once, fell to ~420 MB and took 70 % more CPU).

The allocator reads its options once, from the ``JE_MALLOC_CONF`` environment
variable, when the engine is loaded. So :func:`configure_engine_allocator` runs
in the process that opens the engine, before its first ``import chdb``. A
``JE_MALLOC_CONF`` the user set is kept as it is: jemalloc's own syntax, e.g.
``JE_MALLOC_CONF=dirty_decay_ms:5000`` for the engine's built-in behaviour.

Contract: never blocks, never raises. It only writes this process's
environment, and only while chDB is not loaded yet.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV = "JE_MALLOC_CONF"
DIRTY_DECAY_MS = 300
ENGINE_MALLOC_CONF = f"dirty_decay_ms:{DIRTY_DECAY_MS}"


def configure_engine_allocator(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set :data:`ENV` to :data:`ENGINE_MALLOC_CONF` unless it is set already or chDB is loaded.

    Returns the options the engine will start with (the user's, or rewardflow's), or None
    when chDB is already loaded in this process and its allocator can no longer be set.
    """
    env = os.environ if environ is None else environ
    if "chdb" in sys.modules:
        return None
    return env.setdefault(ENV, ENGINE_MALLOC_CONF)
