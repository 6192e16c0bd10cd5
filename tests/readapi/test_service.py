"""The read endpoint's query slots (a cap in all, a share per token, every slot given back) and the databases a
request may read from."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rewardflow.clickhouse.dsn import parse_dsn
from rewardflow.readapi.service import ReadService
from rewardflow.settings import Settings


def service(tmp_path: Path, **overrides: int) -> ReadService:
    return ReadService(parse_dsn(f"chdb://{tmp_path}/db"), Settings(home=tmp_path, **overrides))


def test_the_cap_answers_503_and_a_tokens_share_429(tmp_path: Path) -> None:
    svc = service(tmp_path, read_max_queries=3, read_max_queries_per_token=2)
    assert svc.take_slot("a") is None and svc.take_slot("a") is None
    refused = svc.take_slot("a")
    assert refused is not None and refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert svc.take_slot("b") is None
    full = svc.take_slot("c")
    assert full is not None and full.status_code == 503
    svc.give_slot("a")
    assert svc.take_slot("c") is None  # a slot given back is anyone's


def test_slots_taken_and_given_back_from_many_threads_never_exceed_the_cap(tmp_path: Path) -> None:
    svc = service(tmp_path, read_max_queries=4, read_max_queries_per_token=3)
    running, most, lock = [0], [0], threading.Lock()

    def client(token: str) -> None:
        for _ in range(2_000):
            if svc.take_slot(token) is None:
                with lock:
                    running[0] += 1
                    most[0] = max(most[0], running[0])
                with lock:
                    running[0] -= 1
                svc.give_slot(token)

    threads = [threading.Thread(target=client, args=(f"t{i % 3}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= most[0] <= 4
    assert all(svc.take_slot(t) is None for t in ("x", "y", "z", "w"))  # all four came back


@pytest.mark.parametrize("database", ["system", "SYSTEM", "information_schema", "INFORMATION_SCHEMA"])
def test_the_engines_own_databases_are_refused_as_a_requests_current_one(tmp_path: Path, database: str) -> None:
    """With ``system`` current, ``merge('^processes$')`` reads other readers' running statements."""
    with pytest.raises(ValueError, match="the engine's own"):
        service(tmp_path).borrow(database)


def test_a_signed_request_taken_by_an_endpoint_is_refused_by_the_next_one_on_its_home(tmp_path: Path) -> None:
    now = int(time.time())
    assert service(tmp_path).nonces.take("0123456789ab", "a" * 32, now) is None
    refused = service(tmp_path).nonces.take("0123456789ab", "a" * 32, now)  # after a restart
    assert refused is not None and refused[0] == 401
