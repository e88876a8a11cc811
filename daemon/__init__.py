"""csmd: streaming continuous subgraph matching. Host side: the engine interface, the engine-neutral
pipeline (GU -> EX -> output, GC), the CPU engine, the Kafka service, the command line, the graph model."""

import time

__version__ = "0.1.0"
# when this process began running csmd's code (every csmd module imports this package first):
# `csmd replay`'s setup_seconds count from here
STARTED = time.monotonic()
