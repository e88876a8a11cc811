"""Taking checkpoints while the daemon runs: a marker in the stream, a background write.

The graph is copied in the updater stage exactly between two input records, so the
consume loop never waits for the pipeline to drain; the folder is written by its
own thread (daemon/service/checkpoint_files.py has the format).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from csmd.pipeline.stages import Marker, Pipeline
from csmd.service.checkpoint_files import write_checkpoint
from csmd.service.context import DaemonContext, Intake
from csmd.service.control import Queries


class CheckpointMarker(Marker):
    """Where a checkpoint is taken: the graph is copied in the updater stage, exactly after
    the records before the marker (`offsets`: the next offset of each partition), without
    draining the pipeline; the queries are those registered when it reaches the output."""

    def __init__(self, offsets: dict[int, int]):
        self.offsets = dict(offsets)
        self.graph = None

    def at_updater(self, pipe: Pipeline) -> None:
        self.graph = pipe.graph_state()


def content(state: dict) -> dict:
    """A checkpoint's state without what says when it was written (its sequence number follows
    from its input offsets): equal contents are equal checkpoints."""
    return {k: v for k, v in state.items() if k not in ("seq", "written", "format")}


class Checkpointer:
    """Takes checkpoints of the daemon's state: the graph the markers copy, the input offsets,
    `queries` (what the control log has done), in the folder [checkpoint] dir. `last`: the newest
    checkpoint's content (content()), None without one; `lowest()`: in a cluster, the lowest progress
    of any shard (the newest checkpoint at or below it is kept too)."""

    def __init__(self, ctx: DaemonContext, queries: Queries, intake: Intake, last: dict | None,
                 lowest: Callable[[], int] | None = None):
        self.ctx, self.queries, self.intake, self.lowest = ctx, queries, intake, lowest
        self._writer: threading.Thread | None = None  # the checkpoint being written, in the background
        self._marker = False  # a checkpoint marker is in the pipeline
        self._last = last  # the newest checkpoint's content

    def state(self, graph, offsets: dict[int, int]) -> dict:
        return {"seq": graph.seq, **self._content(offsets), "written": time.time()}

    def _content(self, offsets: dict[int, int]) -> dict:
        """What a checkpoint at these input offsets holds besides the graph, which the offsets fix:
        equal contents are equal checkpoints."""
        q, t = self.queries, self.ctx.cfg.topics
        return {"offsets": {str(p): o for p, o in offsets.items()}, "control_applied": q.control_applied,
                "removed": sorted(q.removed), "queries": [dict(vars(s)) for s in q.specs.values()],
                "input": t.input, "control": t.control}

    def due(self, offsets: dict[int, int]) -> bool:
        """Whether to take a checkpoint at these offsets now: none is on its way (a marker in the
        pipeline or a writer at work: one at a time, so a slow disk skips intervals; two writers of
        one sequence number would share its folder) and the last written holds something else (an
        idle daemon rewrote an identical one every interval)."""
        busy = self._marker or (self._writer is not None and self._writer.is_alive())
        return not busy and self._content(offsets) != self._last

    def take(self, offsets: dict[int, int]) -> None:
        """Send a checkpoint marker down the pipeline (the consume loop, when one is due)."""
        self._marker = True
        self.intake.put_marker(CheckpointMarker(offsets))

    def write_in_background(self, marker: CheckpointMarker) -> None:
        """A checkpoint marker reached the output: write it without holding the pipeline."""
        state = self.state(marker.graph, marker.offsets)
        self._writer = threading.Thread(target=self.write, args=(marker.graph, state),
                                        name="csmd-checkpoint", daemon=True)
        self._writer.start()
        self._marker = False  # the writer's thread says it is on its way from here

    def wait(self) -> None:
        """Until the checkpoint being written, if any, is written."""
        if self._writer is not None:
            self._writer.join()

    def write(self, graph, state: dict) -> None:
        t0 = time.monotonic()
        c = self.ctx.cfg.checkpoint
        try:
            path = write_checkpoint(c.dir, graph, state, c.keep,
                                    self.lowest() if self.lowest is not None else None)
        except OSError as exc:  # the previous checkpoint stays; the next interval tries again
            self.ctx.log.error("checkpoint failed", dir=c.dir, reason=exc.strerror or str(exc))
            return
        self._last = content(state)
        self.ctx.metrics.inc("csmd_checkpoints_total")
        self.ctx.metrics.set("csmd_checkpoint_seq", state["seq"])
        self.ctx.log.info("checkpoint written", path=str(path), seq=state["seq"],
                          seconds=round(time.monotonic() - t0, 3))
