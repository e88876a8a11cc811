"""The engine-neutral continuous pipeline: sequencer (GU's host side), stages, GC, delta order."""
