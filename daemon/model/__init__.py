"""The graph model, input and output formats, and query planning."""
