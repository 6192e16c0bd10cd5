"""Runtime configuration: one pydantic-settings class, ``REWARDFLOW_`` env prefix.

Sources, highest priority first: constructor arguments, environment variables
(``REWARDFLOW_KAFKA_BOOTSTRAP`` …), an optional TOML file named by
``REWARDFLOW_CONFIG_FILE``, then the defaults below.

Contract: :func:`load_settings` either returns a coherent :class:`Settings` or
raises :class:`SettingsError` whose message names the offending setting and
how to fix it. Unsafe combinations fail here, at start, never later.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
import re
import secrets
import time
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as PydanticSettingsError

log = logging.getLogger(__name__)
DEFAULT_HOME = Path(os.environ.get("REWARDFLOW_HOME", Path.home() / ".rewardflow"))


class SettingsError(ValueError):
    """A setting is missing, malformed or unsafe in combination with another."""


class Settings(BaseSettings):
    """Every knob of rewardflow. Secrets are ``SecretStr`` and never printed."""

    model_config = SettingsConfigDict(
        # hide_input_in_errors: a ValidationError would otherwise quote the whole input, passwords included
        env_prefix="REWARDFLOW_", extra="ignore", validate_default=True, hide_input_in_errors=True
    )

    # --- local state -------------------------------------------------------
    home: Path = Field(DEFAULT_HOME, description="Cache and state directory (Kafka jars, chDB data, PIDs).")

    # --- Kafka ---------------------------------------------------------------
    kafka_bootstrap: str = Field("127.0.0.1:19092", description="Kafka bootstrap servers.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = Field(None, description="e.g. PLAIN, SCRAM-SHA-256")
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    topic_prefix: str = Field("rewardflow.", description="Prefix of every topic the platform owns.")
    partitions: int = Field(4, ge=1, le=1024, description="Partitions of the topics rewardflow creates.")
    topic_replication_factor: int | None = Field(None, ge=1, le=16, description="Replicas of every topic rewardflow and its workers create (raw, outputs, the state changelog). Unset: the cluster's default.replication.factor (1 on the local broker, 3 on `rewardflow kafka up --brokers 3`); 3 on a production cluster.")
    topic_min_insync_replicas: int | None = Field(None, ge=1, le=16, description="min.insync.replicas of those topics (unset: the broker's default). With acks=all, a write succeeds only when this many replicas have it; 2 with a replication factor of 3 survives one broker down without losing an acknowledged record.")
    worker_stall_timeout_s: float = Field(60.0, ge=3.0, le=3600.0, description="A worker with an assigned partition that has records left (to restore from its changelog, or to process on the raw topic) and makes no progress on it for this long stops cleanly and exits 75, so a fresh member of the group takes the partition over (rewardflow run starts the worker again).")
    table_standby_replicas: int = Field(0, ge=0, le=8, description="Standby copies of each partition's join state kept by other workers, so a takeover does not replay the changelog (each standby costs the memory of the state it mirrors).")
    local_kafka_port: int | None = Field(
        None, ge=1024, le=65535,
        description="Client port of the local broker (`rewardflow kafka up`); default: the port of a loopback "
        "kafka_bootstrap, else 19092.")
    local_kafka_controller_port: int | None = Field(
        None, ge=1024, le=65535, description="KRaft controller port of the local broker; default: its client port + 1.")

    # --- ClickHouse ------------------------------------------------------------
    clickhouse_dsn: SecretStr = Field(
        SecretStr(""),
        description="chdb:///abs/path (embedded, default under home) or http(s)://user:pass@host:8123/db",
    )
    events_ttl_days: int = Field(90, ge=1, description="Days the events table keeps each event after it was stored (a change that would delete stored rows needs rewardflow db migrate --allow-data-loss).")

    # --- stream processing -------------------------------------------------------
    allowed_lateness_ms: int = Field(5_000, ge=0, description="Watermark = max event time - this.")
    grace_ms: int = Field(60_000, ge=0, description="Wait after the last horizon before finalising a turn.")
    horizons_s: list[int] = Field([30, 120, 300, 600, 900], description="Persistence horizons, seconds.")
    provisional: bool = Field(False, description="Also emit provisional outcomes at earlier horizons (costs a session load per horizon).")
    idle_timeout_s: float = Field(5.0, gt=0, description="Partition idle this long => watermark follows the wall clock.")
    idle_clock_rate: float = Field(1.0, gt=0, description="Event-time ms advanced per wall ms while idle.")
    dedup_horizon_ms: int = Field(3_600_000, ge=0, description="Duplicate event_ids are dropped within this horizon.")
    tombstone_ms: int = Field(3_600_000, ge=0, description="How long a finalised turn is remembered to route late events.")
    window_sizes_s: list[int] = Field([300, 3600], description="Tumbling window sizes, seconds.")
    max_clock_skew_ms: int = Field(30_000, ge=0, le=3_600_000, description="An event dated further than this after its record's broker timestamp is dead-lettered (future_ts) and never moves a watermark.")
    correction_window_ms: int = Field(
        3_600_000, ge=0, le=7 * 86_400_000,
        description="A signal for a finalised turn (a persistence check, an action, a follow-up) dated at most this "
                    "long after the turn's final deadline corrects it: a new revision of its rewards and window "
                    "deltas. Later signals go to late_events. Finalised turns keep their state this long, so the "
                    "worker's state grows with the turns finalised in the window. 0 turns corrections off.")
    max_session_turns: int = Field(1_000, ge=1, le=100_000, description="Turns one session may hold: open ones plus those finalised within the last TOMBSTONE_MS of event time (longer where the windows or the correction window need it). An event that would open one more is dead-lettered (session_turn_limit). A session can store up to a few times this (docs/trust.md), and the state changelog's record limit allows for it.")
    max_session_events: int = Field(10_000, ge=1, le=1_000_000, description="Events one session may hold in those turns. An event beyond it is dead-lettered (session_event_limit).")
    max_turn_span_ms: int = Field(3_600_000, ge=1_000, le=7 * 86_400_000, description="An AgentEdit dated later than this after its turn's InferenceServed is dead-lettered (turn_span_limit): each edit puts off its turn's deadline, and an open turn holds back the closing of its partition's windows. An event for an open turn dated more than the turn's settle time plus this behind the watermark is dead-lettered (too_old), as is a correction that far behind its turn's deadline.")
    tick_key: SecretStr | None = Field(None, description="Key the workers of a deployment sign idle ticks with (any long random string, the same on every worker). Unset: a key file under home, created on first use; required with a non-loopback Kafka.")
    dead_letter_ratio_limit: float = Field(0.05, ge=0, le=1, description="Alarm when DLQ share over the sliding window exceeds this.")
    dead_letter_window_s: float = Field(60.0, gt=0)
    reward_specs_dir: Path | None = Field(None, description="Directory of reward spec TOML files (default: bundled).")
    active_spec_versions: list[str] = Field([], description="Spec versions scored live (default: all in the directory).")
    max_record_bytes: int = Field(1_000_000, ge=1024, le=8_000_000, description="Largest Kafka record accepted or produced.")
    max_batch_events: int = Field(500, ge=1, le=100_000, description="Largest number of events in one session batch record.")
    worker_batch_records: int = Field(16_000, ge=1, le=100_000, description="The worker processes the raw records of one consumer fetch, up to this many, at once (state written once per batch).")
    worker_fetch_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=64 * 1024 * 1024, description="Most bytes one consumer fetch takes from one raw partition, as the broker stores them (compressed). At the SDK's records, 1 MiB (the Kafka client's default) holds ~5,000: a worker's batch then stops there, and the sessions it touched are written three times as often as with whole batches of worker_batch_records. A worker buffers up to about this much of each raw partition it owns.")
    group_session_timeout_s: float = Field(10.0, ge=6.0, le=300.0, description="Consumer-group session timeout of the worker and the sink: a member that stopped without leaving (killed, hung) is replaced after this long, so a restarted one waits up to this long for its partitions.")
    worker_state_cache_mb: int = Field(128, ge=1, le=1_000_000, description="Megabytes of encoded session state the worker keeps decoded between batches, besides their count (REWARDFLOW_WORKER_STATE_CACHE): a decoded state takes 7 to 20 times its bytes, and a session at its limits is megabytes, so the count alone does not bound the memory. A session beyond it is decoded and re-encoded at each use.")
    worker_state_cache: int = Field(16_384, ge=0, le=1_000_000, description="Session states the worker keeps decoded between batches (a decoded state takes several times its ~10 KB of bytes). A session beyond it is decoded and fully re-encoded at each use: with 6,500 live sessions, a cache of 4,096 made the core ~30% slower. Metric: rewardflow_state_decodes_total.")

    # --- sink ----------------------------------------------------------------------
    sink_batch_rows: int = Field(50_000, ge=1)
    sink_batch_seconds: float = Field(1.0, gt=0, description="The sink inserts at most this long after the oldest row it holds (one insert per table): a final reward is readable about this long after the worker emitted it, plus the insert.")
    heap_trim_seconds: float = Field(2.0, ge=0, le=3600, description="`rewardflow run` gives the C heap's free pages back to the system this often (glibc's malloc_trim, ~2 ms a call); 0 never.")

    # --- web / metrics / read endpoint ------------------------------------------------
    web_host: str = Field("127.0.0.1", description="Address of the read endpoint (web_port) and the worker's metrics (web_port + 1).")
    web_port: int = Field(16066, ge=1024, le=65535)
    worker_metrics_port: int | None = Field(None, ge=1024, le=65535, description="Port of a stream worker's Prometheus metrics (default web_port + 1; `rewardflow run` gives worker i the i-th port after web_port, collect_port skipped).")
    web_tls_certfile: Path | None = Field(None, description="PEM certificate: the read endpoint serves HTTPS.")
    web_tls_keyfile: Path | None = Field(None, description="PEM private key of web_tls_certfile.")
    web_insecure_public: bool = Field(False, description="Serve the read endpoint without TLS on a non-loopback web_host (only behind a TLS proxy on a trusted network).")
    collect_host: str = Field("127.0.0.1", description="Address of the ingestion edge (rewardflow collect).")
    collect_port: int = Field(16068, ge=1024, le=65535, description="Port of the ingestion edge.")
    collect_max_body_bytes: int = Field(1024**2, ge=1024, le=64 * 1024**2, description="Largest request body of the edge, after gzip inflation; larger gets 413.")
    collect_max_events: int = Field(500, ge=1, le=10_000, description="Events one request may carry; more gets 413.")
    collect_max_spans: int = Field(2048, ge=1, le=100_000, description="Spans one OTLP export (POST /v1/traces) may carry; more gets 413.")
    collect_rate_events_per_s: float = Field(5_000.0, gt=0, description="Events per second one key may send (token bucket); more gets 429 with Retry-After.")
    collect_rate_burst: int = Field(20_000, ge=1, description="Events a key may send at once before its rate applies.")
    collect_rate_text_chars_per_s: float = Field(131_072.0, gt=0, description="Characters of free text (FollowUp.text_redacted) per second one key may send (token bucket): scrubbing secrets costs the edge about 2 µs of CPU a character, so this bounds the share of the edge one key can take; more gets 429 with Retry-After.")
    collect_rate_text_burst: int = Field(1_048_576, ge=16_384, description="Characters of free text a key may send at once before its text rate applies; a request carrying more gets 413.")
    collect_new_sessions_per_s: float = Field(5.0, gt=0, description="New sessions per second one key may open (token bucket; a session is new unless among the key's last 50,000); a request opening more gets 429 with Retry-After.")
    collect_new_sessions_burst: int = Field(1_000, ge=1, description="New sessions a key may open at once before its session rate applies.")
    collect_max_connections: int = Field(1_024, ge=8, le=100_000, description="Connections one edge process keeps open at once; more get 503. Bounds the process's open files, which it shares with its Kafka clients (and, under rewardflow run --collect, the sink and the engine).")
    collect_max_client_connections: int | None = Field(None, ge=1, le=100_000, description="Connections one client (an IPv4 address, an IPv6 /64, or all of loopback) may hold open on one edge process; more are closed at once. Unset: REWARDFLOW_COLLECT_MAX_CONNECTIONS, since editors behind one NAT or a proxy in front share an address.")
    collect_idle_timeout_s: float = Field(5.0, gt=0, le=3600, description="The edge closes a connection idle this long (also one that never sends a request), and one whose request line and headers are not all in this long after its first byte.")
    collect_request_timeout_s: float = Field(30.0, gt=0, le=3600, description="The edge closes a connection whose request (headers and body) is not all in this long after its first byte.")
    collect_ack_timeout_s: float = Field(10.0, gt=0, le=300, description="How long a request waits for Kafka's acknowledgement before it gets 503 with Retry-After.")
    collect_clock_tolerance_ms: int = Field(5_000, ge=0, le=60_000, description="A client clock (sent_at) further than this from the edge's is corrected: ts = received_at - (sent_at - ts). Below it, the difference is taken for network and queueing delay.")
    collect_key_refresh_s: float = Field(2.0, gt=0, le=300, description="The edge reloads the keys this often: a revoked key stops working within it.")
    read_token: SecretStr | None = Field(None, description="Bearer token the CLI and RewardReader present to a read endpoint (default: the local token file of the chDB owner).")
    read_max_execution_s: float = Field(120.0, gt=0, le=86_400, description="A read query is stopped after this many seconds.")
    read_max_memory_bytes: int = Field(2 * 1024**3, ge=1024**2, description="Memory one read query may use.")
    read_max_result_rows: int = Field(50_000_000, ge=1, description="Rows one read query may return.")
    read_max_result_bytes: int = Field(8 * 1024**3, ge=1024, description="Bytes one read query may return.")
    read_max_block_bytes: int = Field(64 * 1024**2, ge=1024**2, le=2 * 1024**3, description="Largest block of a read query's result (the engine's blocks of a table's rows are a few MB); a query with a larger one is stopped with an error naming this. A result passes through a few stages in the process, each holding at most this many bytes, outside READ_MAX_MEMORY_BYTES.")
    read_max_queries: int = Field(4, ge=1, le=256, description="Read queries the endpoint runs at once; more get 503 with Retry-After.")
    read_max_queries_per_token: int = Field(3, ge=1, le=256, description="Read queries one token runs at once; more get 429 with Retry-After. Below READ_MAX_QUERIES, no one token holds every query slot.")
    read_max_connections: int = Field(256, ge=8, le=100_000, description="Connections the endpoint keeps open at once; more get 503.")
    read_max_client_connections: int = Field(64, ge=1, le=100_000, description="Connections one client (an IPv4 address, an IPv6 /64, or all of loopback) may hold open on the endpoint; more are closed at once. Behind a proxy every client has the proxy's address: raise it to READ_MAX_CONNECTIONS there and let the proxy limit each client.")
    read_idle_timeout_s: float = Field(5.0, gt=0, le=3600, description="The endpoint closes a connection idle this long (also one that never sends a request), and one whose request line and headers are not all in this long after its first byte.")
    read_request_timeout_s: float = Field(30.0, gt=0, le=3600, description="The endpoint closes a connection whose request (headers and body) is not all in this long after its first byte.")
    read_send_timeout_s: float = Field(60.0, gt=0, le=3600, description="The endpoint closes a connection that takes none of its response for this long, which stops its query and frees its slot. A client that works on each batch as it arrives must read again within it.")
    read_max_body_bytes: int = Field(1024**2, ge=1024, le=64 * 1024**2, description="Largest request body of the endpoint (SQL and parameters); larger gets 413.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        cfg = os.environ.get("REWARDFLOW_CONFIG_FILE")
        if cfg:  # keys as fields (web_port) or as their variables (REWARDFLOW_WEB_PORT); load_settings checked them
            table = tomllib.loads(Path(cfg).read_text())
            sources.append(InitSettingsSource(settings_cls, {_field_of(k): v for k, v in table.items()}))
        return tuple(sources)

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if not self.clickhouse_dsn.get_secret_value():
            self.clickhouse_dsn = SecretStr(f"chdb://{(self.home / 'chdb').resolve()}")
        if sorted(set(self.horizons_s)) != self.horizons_s or not self.horizons_s:
            raise ValueError("REWARDFLOW_HORIZONS_S must be a non-empty, strictly increasing list of seconds")
        if any(h <= 0 for h in self.horizons_s):
            raise ValueError("REWARDFLOW_HORIZONS_S must be positive")
        if not self.window_sizes_s or any(w <= 0 for w in self.window_sizes_s):
            raise ValueError("REWARDFLOW_WINDOW_SIZES_S must be a non-empty list of positive seconds")
        if self.kafka_security_protocol.startswith("SASL") and not (
            self.kafka_sasl_mechanism and self.kafka_sasl_username and self.kafka_sasl_password
        ):
            raise ValueError(
                "REWARDFLOW_KAFKA_SECURITY_PROTOCOL=SASL_* needs REWARDFLOW_KAFKA_SASL_MECHANISM, "
                "REWARDFLOW_KAFKA_SASL_USERNAME and REWARDFLOW_KAFKA_SASL_PASSWORD"
            )
        if self.kafka_sasl_password is not None and self.kafka_security_protocol == "SASL_PLAINTEXT":
            remote = [h for h in _bootstrap_hosts(self.kafka_bootstrap) if not _is_loopback(h)]
            if remote:  # every server of the list, not only the first, may receive the password
                raise ValueError(
                    f"refusing to send a SASL password in clear text to a non-loopback broker ({', '.join(remote)}): "
                    "use REWARDFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL"
                )
        if self.dedup_horizon_ms > self.tombstone_ms and self.tombstone_ms == 0:
            raise ValueError("REWARDFLOW_TOMBSTONE_MS=0 with dedup enabled would misroute late duplicates")
        if self.grace_ms < self.max_clock_skew_ms + self.allowed_lateness_ms:
            raise ValueError(
                f"REWARDFLOW_GRACE_MS ({self.grace_ms}) must be at least REWARDFLOW_MAX_CLOCK_SKEW_MS + "
                f"REWARDFLOW_ALLOWED_LATENESS_MS "
                f"({self.max_clock_skew_ms} + {self.allowed_lateness_ms}): an event dated ahead by the allowed skew "
                "could otherwise finalise turns before their last signal arrived. Raise REWARDFLOW_GRACE_MS or "
                "lower REWARDFLOW_MAX_CLOCK_SKEW_MS"
            )
        isr, rf = self.topic_min_insync_replicas, self.topic_replication_factor
        if isr is not None and rf is not None and isr > rf:
            raise ValueError(f"REWARDFLOW_TOPIC_MIN_INSYNC_REPLICAS ({isr}) cannot exceed "
                             f"REWARDFLOW_TOPIC_REPLICATION_FACTOR ({rf}): no write could succeed")
        if self.tick_key is not None and len(self.tick_key.get_secret_value()) < 16:
            raise ValueError("REWARDFLOW_TICK_KEY must be at least 16 characters (use a long random string)")
        if (self.web_tls_certfile is None) != (self.web_tls_keyfile is None):
            raise ValueError("REWARDFLOW_WEB_TLS_CERTFILE and REWARDFLOW_WEB_TLS_KEYFILE go together")
        if not _is_loopback(self.collect_host) and self.web_tls_certfile is None and not self.web_insecure_public:
            raise ValueError(
                f"REWARDFLOW_COLLECT_HOST {self.collect_host} is not a loopback address: keys and events would cross the "
                "network in clear text. Set REWARDFLOW_WEB_TLS_CERTFILE and REWARDFLOW_WEB_TLS_KEYFILE, or, behind a "
                "TLS proxy on a trusted network, REWARDFLOW_WEB_INSECURE_PUBLIC=true"
            )
        if not _is_loopback(self.web_host) and self.web_tls_certfile is None and not self.web_insecure_public:
            raise ValueError(
                f"REWARDFLOW_WEB_HOST {self.web_host} is not a loopback address: the read endpoint would serve SQL and "
                "bearer tokens in clear text. Set REWARDFLOW_WEB_TLS_CERTFILE and REWARDFLOW_WEB_TLS_KEYFILE, or, "
                "behind a TLS proxy on a trusted network, REWARDFLOW_WEB_INSECURE_PUBLIC=true"
            )
        if self.local_broker_port == self.local_broker_controller_port:
            raise ValueError("the local broker's client and controller ports must differ "
                             "(REWARDFLOW_LOCAL_KAFKA_PORT, REWARDFLOW_LOCAL_KAFKA_CONTROLLER_PORT)")
        return self

    # --- derived ---------------------------------------------------------------------
    @property
    def local_broker_port(self) -> int:
        """The local broker's client port: set, or the first port of a loopback bootstrap (a local cluster's
        first node: ``rewardflow kafka up --brokers 3`` prints such a list), or 19092."""
        if self.local_kafka_port is not None:
            return self.local_kafka_port
        items = [x.strip() for x in self.kafka_bootstrap.split(",") if x.strip()]
        if items and all(_is_loopback(h) for h in _bootstrap_hosts(self.kafka_bootstrap)):
            port = items[0].rsplit(":", 1)[-1]
            if port.isdigit() and 1024 <= int(port) < 65535:
                return int(port)
        return 19092

    @property
    def local_broker_controller_port(self) -> int:
        """The local broker's KRaft controller port: set, or the client port + 1."""
        return self.local_kafka_controller_port or self.local_broker_port + 1

    def topic(self, name: str) -> str:
        """Full topic name for a logical name such as ``events.raw``."""
        return f"{self.topic_prefix}{name}"

    @property
    def dsn(self) -> str:
        return self.clickhouse_dsn.get_secret_value()

    def kafka_client_config(self) -> dict[str, Any]:
        """confluent-kafka (librdkafka) connection and security config. librdkafka's own log lines go to
        the Python logger ``rewardflow.librdkafka`` (errors only, unless configured lower), never raw
        to the terminal."""
        cfg: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap, "logger": LIBRDKAFKA_LOG}
        if self.kafka_security_protocol != "PLAINTEXT":
            cfg["security.protocol"] = self.kafka_security_protocol
        if self.kafka_sasl_mechanism:
            cfg["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username:
            cfg["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password is not None:
            cfg["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_cafile:
            cfg["ssl.ca.location"] = str(self.kafka_ssl_cafile)
        return cfg


LIBRDKAFKA_LOG = logging.getLogger("rewardflow.librdkafka")
if LIBRDKAFKA_LOG.level == logging.NOTSET:  # its transient start-up warnings (GETPID, retries) are not the user's
    LIBRDKAFKA_LOG.setLevel(logging.ERROR)


def _bootstrap_hosts(bootstrap: str) -> list[str]:
    """The host of every ``host:port`` (or ``[v6]:port``) in a bootstrap list."""
    hosts = []
    for item in filter(None, (x.strip() for x in bootstrap.split(","))):
        host = item.rsplit(":", 1)[0] if item.count(":") == 1 or item.startswith("[") else item
        hosts.append(host.strip("[]"))
    return hosts


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tick_key(settings: Settings) -> bytes:
    """The key the workers sign ticks with: ``tick_key``, else the key file ``home/tick.key``
    (created on first use, mode 0600, by whichever process comes first).

    Raises :class:`SettingsError` when the key is unset and Kafka is not on this machine: workers on
    other hosts could not share a key file, and their ticks would be refused as forged.
    """
    if settings.tick_key is not None:
        return settings.tick_key.get_secret_value().encode()
    remote = [h for h in _bootstrap_hosts(settings.kafka_bootstrap) if not _is_loopback(h)]
    if remote:
        raise SettingsError(
            f"REWARDFLOW_TICK_KEY is required with a non-loopback Kafka ({', '.join(remote)}): set the same long "
            "random string on every worker of the deployment")
    path = settings.home / "tick.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    for _ in range(50):  # another process may have created it and not written it yet
        key = path.read_text().strip()
        if key:
            return key.encode()
        time.sleep(0.02)
    raise SettingsError(f"the tick key file {path} is empty: delete it, or set REWARDFLOW_TICK_KEY")


OTHER_VARIABLES = frozenset({"REWARDFLOW_CONFIG_FILE", "REWARDFLOW_SCHEMA_DIR", "REWARDFLOW_DEBUG", "REWARDFLOW_VENV",
                             "REWARDFLOW_TEST_KAFKA_BOOTSTRAP", "REWARDFLOW_KEY"})
"""Variables rewardflow reads that are not settings: the config file, the schema directory, tracebacks,
``scripts/run.sh``'s virtualenv, the test suite's broker; and the ingest key the TypeScript client's examples
read."""
_warned: set[str] = set()


def _field_of(key: str) -> str:
    """The setting a config-file key names: ``web_port`` or ``REWARDFLOW_WEB_PORT``."""
    low = key.lower()
    return low.removeprefix("rewardflow_")


def _did_you_mean(key: str, prefix: str = "") -> str:
    close = difflib.get_close_matches(_field_of(key), list(Settings.model_fields), n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0].upper() if prefix else close[0]}?)" if close else ""


def _warn_unknown_variables() -> None:
    """Warn, once a process, of each ``REWARDFLOW_*`` variable that is no setting: a misspelt one is
    otherwise ignored, and its default used."""
    for name in sorted(os.environ):
        if (name.startswith("REWARDFLOW_") and name not in OTHER_VARIABLES and name not in _warned
                and _field_of(name) not in Settings.model_fields):
            _warned.add(name)
            log.warning("%s is not a rewardflow setting and is ignored%s", name, _did_you_mean(name, "REWARDFLOW_"))


def load_settings(**overrides: Any) -> Settings:
    """Build settings from overrides, env and the optional config file.

    Raises :class:`SettingsError` with one line per problem, each naming the
    ``REWARDFLOW_…`` variable to change.
    """
    cfg = os.environ.get("REWARDFLOW_CONFIG_FILE")
    if cfg and not Path(cfg).is_file():
        raise SettingsError(f"REWARDFLOW_CONFIG_FILE={cfg} does not exist")
    if cfg:
        try:
            table = tomllib.loads(Path(cfg).read_text())
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"REWARDFLOW_CONFIG_FILE={cfg} is not valid TOML: {exc}") from exc
        unknown = [k for k in table if _field_of(k) not in Settings.model_fields]
        if unknown:
            raise SettingsError(f"REWARDFLOW_CONFIG_FILE={cfg}: unknown setting(s) "
                                + ", ".join(f"{k!r}{_did_you_mean(k)}" for k in unknown)
                                + "; a key is a setting's name (web_port) or its variable (REWARDFLOW_WEB_PORT)")
    _warn_unknown_variables()
    try:
        return Settings(**overrides)
    except PydanticSettingsError as exc:  # a value the source cannot parse: a list or a map not written as JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"REWARDFLOW_{field.group(1).upper()}" if field else "a setting"
        raise SettingsError(f"invalid configuration: {name}: cannot parse its value; a list or a map is written "
                            "as JSON, e.g. [30, 120]") from None
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"REWARDFLOW_{loc.upper()}: {msg}" if loc else msg)
        if len(lines) == 1:
            raise SettingsError(f"invalid configuration: {lines[0]}") from None
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
