pytest_plugins = ["tests.conftest_kafka", "tests.conftest_clickhouse"]
