"""Nothing listens beyond loopback unless configured to: the local broker and the worker's endpoints.

* The local broker's rendered ``server.properties`` binds and advertises
  127.0.0.1 only (every listener, the controller quorum), and the running
  session broker is unreachable through any other local address.
* ``web_host`` defaults to 127.0.0.1: the worker's Faust web server (metrics)
  and the chDB owner's read endpoint bind it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from rewardflow.clickhouse.dsn import parse_dsn
from rewardflow.readapi.server import ReadServer
from rewardflow.kafka_local.config import BrokerConfig, render_properties, server_properties
from rewardflow.settings import Settings

LOOPBACK = "127.0.0.1"


def parse_properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def hosts_of(props: dict[str, str]) -> list[str]:
    """Every host named by a listener-like property (``NAME://host:port`` or ``host:port`` lists)."""
    hosts = []
    for key in ("listeners", "advertised.listeners", "controller.quorum.bootstrap.servers",
                "controller.quorum.voters"):
        for item in filter(None, props.get(key, "").split(",")):
            address = item.split("://", 1)[-1].split("@", 1)[-1]
            hosts.append(address.rsplit(":", 1)[0])
    return hosts


def test_rendered_server_properties_bind_loopback_only(tmp_path: Path) -> None:
    props = parse_properties(render_properties(server_properties(BrokerConfig(29092, 29093, 4, tmp_path))))
    hosts = hosts_of(props)
    assert len(hosts) >= 4 and set(hosts) == {LOOPBACK}, hosts
    assert not any(k.endswith("listeners") and ("0.0.0.0" in v or "://:" in v) for k, v in props.items())


def _non_loopback_addresses() -> list[str]:
    found = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
            found.add(s.getsockname()[0])
    except OSError:
        pass
    try:
        found.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


@pytest.mark.kafka
def test_running_broker_is_bound_to_loopback_only(kafka_broker: Any) -> None:
    if kafka_broker.local is None:
        pytest.skip("an external broker (REWARDFLOW_TEST_KAFKA_BOOTSTRAP) is not ours to check")
    props = parse_properties(kafka_broker.local.properties_file.read_text())
    assert set(hosts_of(props)) == {LOOPBACK}
    port = int(kafka_broker.bootstrap.rsplit(":", 1)[1])
    with socket.create_connection((LOOPBACK, port), timeout=5):
        pass
    addresses = _non_loopback_addresses()
    for address in addresses:
        with pytest.raises(OSError), socket.create_connection((address, port), timeout=3):
            pass
    print("broker refused on", addresses or "(no non-loopback address on this host)")


def test_web_host_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REWARDFLOW_WEB_HOST", raising=False)
    monkeypatch.delenv("REWARDFLOW_CONFIG_FILE", raising=False)
    assert Settings(home=tmp_path).web_host == LOOPBACK
    assert ReadServer(parse_dsn(f"chdb://{tmp_path / 'db'}"), Settings(home=tmp_path), port=0).host == LOOPBACK


def test_worker_web_server_binds_the_configured_loopback_host(tmp_path: Path) -> None:
    from rewardflow_streams.app import JoinWorker

    join = JoinWorker(Settings(home=tmp_path), web=True)
    assert join.app.conf.web_bind == LOOPBACK and join.app.conf.web_host == LOOPBACK


def test_read_endpoint_listens_on_loopback(tmp_path: Path) -> None:
    server = ReadServer(parse_dsn(f"chdb://{tmp_path / 'db'}"), Settings(home=tmp_path), port=0)  # binds now
    try:
        assert server.url.startswith(f"http://{LOOPBACK}:")
        host, port = server._sock.getsockname()[:2]
        assert host == LOOPBACK
        for address in _non_loopback_addresses():
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=3):
                pass
    finally:
        server.stop()
