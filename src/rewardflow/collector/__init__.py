"""The ingestion edge: editors and agents send events over HTTP(S) with a key; the collector validates,
corrects client clocks, redacts free text and produces to the raw topic (``rewardflow collect``)."""
