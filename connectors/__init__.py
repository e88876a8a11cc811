"""Sources and sinks: Kafka (confluent-kafka), files, the embedded broker."""
