"""OpenTelemetry GenAI spans as rewardflow events: the mapping, version :data:`MAPPING_VERSION`.

The table in ``docs/sending-events.md`` documents it field by field. In short:

* an inference span (``gen_ai.operation.name`` ``chat``, ``text_completion`` or
  ``generate_content``) becomes ``InferenceServed``;
* an ``execute_tool`` span becomes ``ToolCall``: an error status becomes ``error``, or ``broken``
  when ``error.type`` names a malformed call (:data:`BROKEN_ERROR_TYPES`);
* ``gen_ai.conversation.id`` becomes ``session_id``; the agent turn, ``request_id``, is
  ``rewardflow.request_id`` when set, else the trace (one trace, one turn);
* what the conventions lack is read from ``rewardflow.*`` attributes of the span, else of its
  resource: ``rewardflow.checkpoint_id``, ``rewardflow.experiment_arm``, ``rewardflow.surface``,
  ``rewardflow.session_id``, ``rewardflow.request_id``, ``rewardflow.tool_status``.

Every span either becomes one event or is counted under a reason (:data:`REASONS`); the caller
reports the counts. Event ids are ``otel-<trace id>-<span id>``, so an exporter's retry of the same
spans is deduplicated downstream.

Contract: pure, no I/O, deterministic. The events are plain dicts in the contract's shape; the
caller validates them with the contract's own code (a span whose event fails is counted there).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rewardflow.events.validate import shown
from rewardflow.otlp.spans import STATUS_ERROR, Span

MAPPING_VERSION = 1
INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"
BROKEN_ERROR_TYPES = frozenset({"malformed_tool_call", "invalid_tool_arguments", "unknown_tool"})
TOOL_STATUSES = frozenset({"ok", "error", "broken"})
DEFAULT_SURFACE, DEFAULT_ARM = "agent", "default"
_KNOWN_OPERATIONS = INFERENCE_OPERATIONS | {TOOL_OPERATION, "invoke_agent", "create_agent", "embeddings"}

REASONS = (
    "not_genai",            # no gen_ai.operation.name
    "operation:invoke_agent", "operation:create_agent", "operation:embeddings", "operation:other",
    "no_model",             # an inference span naming no model and no rewardflow.checkpoint_id
    "no_tool_name",         # an execute_tool span without gen_ai.tool.name
    "bad_times",            # end before start, or no time at all
    "unmappable",           # an attribute of a shape the mapping cannot read (a safety net: none is known)
)


@dataclass
class Mapped:
    """The outcome of :func:`map_spans`: events in span order, and the spans left out by reason."""

    events: list[dict[str, Any]] = field(default_factory=list)
    unmapped: Counter[str] = field(default_factory=Counter)


def map_spans(spans: Iterable[Span]) -> Mapped:
    """Each span's event, or its reason (see :data:`REASONS`). ``org_id`` is left to the caller."""
    out = Mapped()
    for span in spans:
        try:
            event = map_span(span)
        except (TypeError, ValueError, OverflowError, RecursionError):  # a client's attribute, never the edge's fault
            event = "unmappable"
        if isinstance(event, str):
            out.unmapped[event] += 1
        else:
            out.events.append(event)
    return out


def map_span(span: Span) -> dict[str, Any] | str:
    """One span's event, or the reason it has none."""
    op = span.attr("gen_ai.operation.name")
    if not isinstance(op, str):
        return "not_genai"
    if op not in INFERENCE_OPERATIONS and op != TOOL_OPERATION:
        return f"operation:{op if op in _KNOWN_OPERATIONS else 'other'}"
    if span.end_ns < span.start_ns or span.end_ns == 0:
        return "bad_times"
    base = _envelope(span)
    duration_ms = (span.end_ns - span.start_ns) // 1_000_000
    if op == TOOL_OPERATION:
        tool = span.attr("gen_ai.tool.name")
        if tool is None:
            return "no_tool_name"
        status = _tool_status(span)
        call_id = span.attr("gen_ai.tool.call.id")
        error_kind = span.attr("error.type") or span.status_message or None
        return {**base, "event_type": "ToolCall", "call_id": call_id if call_id is not None else span.span_id,
                "tool": tool, "status": status, "duration_ms": duration_ms,
                "error_kind": shown(error_kind, 128) if status != "ok" and error_kind is not None else None}
    checkpoint = span.attr("rewardflow.checkpoint_id", "gen_ai.response.model", "gen_ai.request.model")
    if checkpoint is None:
        return "no_model"
    ttft = _ttft_ms(span)
    return {**base, "event_type": "InferenceServed",
            "surface": span.attr("rewardflow.surface") or DEFAULT_SURFACE,
            "checkpoint_id": checkpoint,
            "experiment_arm": span.attr("rewardflow.experiment_arm") or DEFAULT_ARM,
            "ttft_ms": duration_ms if ttft is None else min(ttft, duration_ms), "latency_ms": duration_ms,
            "prompt_tokens": span.attr("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens") or 0,
            "completion_tokens": span.attr("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens") or 0}


def _envelope(span: Span) -> dict[str, Any]:
    session = span.attr("gen_ai.conversation.id", "rewardflow.session_id")
    request = span.attr("rewardflow.request_id")
    return {
        "event_id": f"otel-{span.trace_id}-{span.span_id}",
        "schema_version": 1,
        "ts": span.end_ns // 1_000_000,
        "session_id": session if session is not None else span.trace_id,
        "request_id": request if request is not None else span.trace_id,
        "producer": {"name": str(span.resource.get("service.name") or "otlp")[:64],
                     "version": str(span.resource.get("service.version")
                                    or span.resource.get("telemetry.sdk.version") or "unknown")[:64]},
    }


def _tool_status(span: Span) -> str:
    explicit = span.attr("rewardflow.tool_status")
    if isinstance(explicit, str) and explicit in TOOL_STATUSES:
        return explicit
    error_type = span.attr("error.type")
    if isinstance(error_type, str) and error_type in BROKEN_ERROR_TYPES:
        return "broken"
    return "error" if span.status_code == STATUS_ERROR or span.attr("error.type") is not None else "ok"


def _ttft_ms(span: Span) -> int | None:
    """Time to first token: ``rewardflow.ttft_ms``, else ``gen_ai.response.time_to_first_chunk``
    (seconds); None when neither is a finite number."""
    ms = span.attr("rewardflow.ttft_ms")
    if _finite(ms):
        return max(0, int(ms))
    s = span.attr("gen_ai.response.time_to_first_chunk")
    if _finite(s) and math.isfinite(s * 1000):
        return max(0, int(s * 1000))
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
