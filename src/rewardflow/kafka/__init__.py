"""Topics and provisioning on any Kafka cluster (the local broker for development is ``kafka_local``)."""
