"""The CPU engine: multi-version graph, executor and static matcher (numpy)."""
