import pytest

pytest_plugins = ["tests.conftest_kafka", "tests.conftest_clickhouse"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup``: the fault tests (when selected) run one after another in one
    process. ``scripts/run.sh test`` runs them apart, after the rest, so nothing competes with them."""
    for item in items:
        if item.get_closest_marker("fault") is not None:
            item.add_marker(pytest.mark.xdist_group("fault"))
