"""Analyst views. Each reads with ``FINAL`` so a row delivered twice is counted once.

* ``rewards_latest`` - one row per spec_version and turn (org_id, session_id, sample_id): the final outcome's
  latest revision if there is one, else the most advanced provisional one.
  Filter it by ``checkpoint_id`` for the latest rewards of a checkpoint.
* ``rewards_daily`` - per day (of served_ts, UTC) x spec_version x checkpoint x
  arm x surface, over final outcomes (latest revision): samples, mean reward and
  guard rates.
* ``windows_merged`` - the partials of each window (grouped by window_key)
  merged by summing; mergeable maps are summed key-wise. Latency quantiles of a
  merged window come from its ``latency_hist`` in Python
  (:func:`merged_latency_quantile`).
* ``rewards_lineage`` - every row of ``rewards FINAL`` with the lineage of its
  checkpoint from the registry ``checkpoints``, computed when read (a checkpoint
  registered after its rows were stored gets lineage too): ``policy_generation``,
  ``policy_age_s`` (served_ts minus the checkpoint's deployed_at_ms, seconds) and
  ``policy_lag`` (the highest registered generation minus policy_generation); all
  three are NULL for a checkpoint that is not registered. The registry is read once
  per query, so every row's lag counts from the same newest generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rewardflow.core.histogram import LogHistogram


@dataclass(frozen=True)
class ViewDef:
    """A view: its name, what it answers, and its SELECT."""

    name: str
    doc: str
    select: str

    def ddl(self) -> str:
        """``CREATE OR REPLACE VIEW`` (idempotent; re-running refreshes the definition)."""
        return f"CREATE OR REPLACE VIEW `{self.name}` AS\n{self.select.strip()}"


REWARDS_LATEST = ViewDef(
    "rewards_latest",
    "One row per spec_version and turn (org_id, session_id, sample_id): the final outcome's latest revision, else "
    "the latest provisional one.",
    """
SELECT *
FROM rewards FINAL
ORDER BY spec_version, org_id, session_id, sample_id, provisional ASC, revision DESC, horizon_s DESC
LIMIT 1 BY spec_version, org_id, session_id, sample_id
""",
)

REWARDS_DAILY = ViewDef(
    "rewards_daily",
    "Per day x spec_version x checkpoint x arm x surface over final outcomes (latest revision): samples, reward mean/std, "
    "persistence, dissatisfied, follow-up, clarifying, edit, accept and broken-tool rates, latency.",
    """
SELECT
    toDate(fromUnixTimestamp64Milli(served_ts, 'UTC')) AS day,
    spec_version,
    checkpoint_id,
    experiment_arm,
    surface,
    count() AS samples,
    avg(reward) AS mean_reward,
    stddevSamp(reward) AS reward_std,
    sum(persisted[horizon_s]) / nullIf(sum(checked[horizon_s]), 0) AS persistence_rate,
    avg(n_dissatisfied > 0) AS dissatisfied_rate,
    avg(n_followups > 0) AS followup_rate,
    avg(n_clarifying > 0) AS clarifying_rate,
    avg(n_edits > 0) AS edit_rate,
    sum(n_accept) / nullIf(sum(n_accept + n_reject), 0) AS accept_rate,
    sum(n_tool_broken) / nullIf(sum(n_tool_calls), 0) AS tool_broken_rate,
    avg(latency_ms) AS mean_latency_ms,
    quantile(0.5)(latency_ms) AS p50_latency_ms,
    avg(completion_tokens) AS mean_completion_tokens
FROM (
    SELECT * FROM rewards FINAL WHERE provisional = 0
    ORDER BY spec_version, org_id, session_id, sample_id, revision DESC
    LIMIT 1 BY spec_version, org_id, session_id, sample_id
)
GROUP BY day, spec_version, checkpoint_id, experiment_arm, surface
""",
)

WINDOWS_MERGED = ViewDef(
    "windows_merged",
    "Window partials merged per window_key: sums, mean reward, rates and key-wise summed maps.",
    """
SELECT
    window_key,
    any(window_start) AS window_start,
    any(window_end) AS window_end,
    any(window_size_s) AS window_size_s,
    any(checkpoint_id) AS checkpoint_id,
    any(experiment_arm) AS experiment_arm,
    any(surface) AS surface,
    any(spec_version) AS spec_version,
    count() AS partials,
    sum(samples) AS samples,
    sum(reward_sum) AS reward_sum,
    sum(reward_sq_sum) AS reward_sq_sum,
    sum(reward_windows.reward_sum) / nullIf(sum(reward_windows.samples), 0) AS mean_reward,
    sum(turns_with_edit) AS turns_with_edit,
    sum(turns_dissatisfied) AS turns_dissatisfied,
    sum(turns_followup) AS turns_followup,
    sum(turns_clarifying) AS turns_clarifying,
    sum(turns_broken) AS turns_broken,
    sum(tool_calls) AS tool_calls,
    sum(tool_broken) AS tool_broken,
    sum(tool_error) AS tool_error,
    sum(completion_tokens_sum) AS completion_tokens_sum,
    sumMap(persisted) AS persisted,
    sumMap(checked) AS checked,
    sumMap(latency_hist) AS latency_hist
FROM reward_windows FINAL
GROUP BY window_key
""",
)

REWARDS_LINEAGE = ViewDef(
    "rewards_lineage",
    "Every rewards row (FINAL) with its checkpoint's lineage from the registry: policy_generation, policy_age_s "
    "(served_ts minus the checkpoint's deployed_at_ms, seconds) and policy_lag (generations behind the newest "
    "registered one); NULL when the checkpoint is not registered.",
    """
SELECT
    rewards.*,
    lineage.policy_generation AS policy_generation,
    (rewards.served_ts - lineage.deployed_at_ms) / 1000 AS policy_age_s,
    lineage.policy_lag AS policy_lag
FROM rewards FINAL
LEFT JOIN (
    SELECT
        checkpoint_id,
        toNullable(generation) AS policy_generation,
        toNullable(deployed_at_ms) AS deployed_at_ms,
        toNullable(toUInt32(max(generation) OVER () - generation)) AS policy_lag
    FROM (SELECT checkpoint_id, generation, deployed_at_ms FROM checkpoints ORDER BY _seq LIMIT 1 BY checkpoint_id)
) AS lineage ON rewards.checkpoint_id = lineage.checkpoint_id
""",
)

ALL_VIEWS: tuple[ViewDef, ...] = (REWARDS_LATEST, REWARDS_DAILY, WINDOWS_MERGED, REWARDS_LINEAGE)


def merged_latency_quantile(latency_hist: Mapping[int, int], q: float) -> float:
    """Quantile ``q`` of a merged window's ``latency_hist`` (ms), via the stream's own histogram."""
    return LogHistogram(counts=latency_hist).quantile(q)
