"""csmd: streaming continuous subgraph matching. Host side: the engine interface, the engine-neutral
pipeline (GU -> EX -> output, GC), the CPU engine, the Kafka service, the command line, the graph model."""

__version__ = "0.1.0"
