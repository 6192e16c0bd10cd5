pytest_plugins = ["tests.conftest_kafka"]
