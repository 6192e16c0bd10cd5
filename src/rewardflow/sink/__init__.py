"""The ClickHouse sink: output topics → tables (route: :mod:`.route`)."""
