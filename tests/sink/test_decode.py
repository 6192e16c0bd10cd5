"""The sink's decode stage: what one Kafka record of an output topic becomes. Pure."""

from __future__ import annotations

import orjson
import pytest

from rewardflow.sink.decode import MessageRejected, line_from_message, rows_from_message
from tests.clickhouse.rows import reward


def test_rows_from_message_is_the_decoded_list() -> None:
    rows = [reward(1), reward(2)]
    value = orjson.dumps(rows, option=orjson.OPT_NON_STR_KEYS)
    table, got = rows_from_message("rewards", value)
    assert table == "rewards" and [g["reward_id"] for g in got] == [r["reward_id"] for r in rows]
    for bad, code in ((b"{}", "sink_not_a_list"), (b"[1,2]", "sink_not_a_list"), (b"nope", "sink_bad_json"), (None, "sink_null_value")):
        with pytest.raises(MessageRejected) as info:
            rows_from_message("rewards", bad)
        assert info.value.reason_code == code
    with pytest.raises(KeyError):
        rows_from_message("events.raw", value)


def test_line_from_message_frames_without_parsing() -> None:
    value = orjson.dumps([reward(1), reward(2), reward(3)], option=orjson.OPT_NON_STR_KEYS)
    line = line_from_message("rewards", value)
    assert (line.table, line.rows) == ("rewards", 3)
    assert orjson.loads(b"[" + line.body + b"]") == orjson.loads(value)
    assert line_from_message("rewards", b" [] ").rows == 0
    with pytest.raises(MessageRejected):
        line_from_message("rewards", b'{"reward_id": 1}')
