"""csmd: streaming continuous subgraph matching (host side: graph, planning, CPU engine, CLI)."""

__version__ = "0.1.0"
