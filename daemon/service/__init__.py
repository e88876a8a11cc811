"""The Kafka service: `csmd run`, its admin endpoint, delivery, checkpoints, metrics, config and logs."""
