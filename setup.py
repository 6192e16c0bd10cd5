"""Build of the optional C extensions ``rewardflow.client._speedups`` and ``rewardflow.events._avrofast`` (everything else is in pyproject.toml).

The extensions are *optional*: when they cannot be compiled (no C compiler or no
Python headers) the install still succeeds, setuptools prints a warning, and
the producer uses its pure-Python writers (``rewardflow.client.speedups``
logs a notice) and the consumer fastavro alone (``rewardflow.events.avro_fast``). ``REWARDFLOW_BUILD_SPEEDUPS=0`` skips the build on purpose.
"""

import os

from setuptools import Extension, setup

ext_modules = []
if os.environ.get("REWARDFLOW_BUILD_SPEEDUPS", "1").strip() not in ("0", "false", "no"):
    ext_modules.append(Extension(
        "rewardflow.client._speedups",
        sources=["src/rewardflow/client/_speedups.c"],
        optional=True,
    ))
    ext_modules.append(Extension(  # the stream worker's Avro decoder (fastavro stays the fallback)
        "rewardflow.events._avrofast",
        sources=["src/rewardflow/events/_avrofast.c"],
        optional=True,
    ))

setup(ext_modules=ext_modules)
