"""Policy lineage: which checkpoint served a sample, what it was trained from, and when it went live.

* :mod:`.registry` - the registry as data: :class:`~.registry.Checkpoint`, generations, lag, and
  the rules of a registration (pure).
* :mod:`.store` - the ``checkpoints`` table: register (write) and load (read through any reader).
* :mod:`.columns` - the lineage columns appended to the trainer's Arrow batches.

Asynchronous trainers cap how stale their data may be (AReaL's ``max_head_offpolicyness``);
``RewardReader(max_policy_lag=N)`` and ``rewardflow export --max-policy-lag N`` apply that cap
from the registry, and the view ``rewards_lineage`` gives analysts the same columns in SQL.
"""
