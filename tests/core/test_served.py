"""The open served turns' earliest served time, against a plain map over random changes."""

from __future__ import annotations

import random

from rewardflow.core.served import OpenServed


def test_the_earliest_is_the_plain_minimum_after_any_changes_and_the_heap_stays_bounded() -> None:
    rng = random.Random(5)
    served, model = OpenServed({("s", "r0"): 50}), {("s", "r0"): 50}
    keys = [("s", f"r{i}") for i in range(40)] + [("t", f"r{i}") for i in range(40)]
    for _ in range(20_000):
        key = rng.choice(keys)
        if rng.random() < 0.5:
            ts = rng.randrange(1_000)
            served[key] = ts
            model[key] = ts
        else:
            assert served.pop(key) == model.pop(key, None)
        assert served.earliest() == (min(model.values()) if model else None)
        assert len(served) == len(model) and bool(served) == bool(model)
        assert len(served._heap) <= 2 * len(model) + 64
    for key, ts in model.items():  # what it holds is the model's, key by key
        assert served.pop(key) == ts
    assert not served and served.earliest() is None


def test_a_turn_held_open_keeps_the_earliest_while_others_come_and_go() -> None:
    served = OpenServed()
    served[("attacker", "held")] = 10
    for i in range(10_000):
        served[("s", f"r{i}")] = 100 + i
        served.pop(("s", f"r{i}"))
        assert served.earliest() == 10
    assert len(served._heap) <= 2 * len(served) + 64  # the finished turns' entries do not pile up under it
