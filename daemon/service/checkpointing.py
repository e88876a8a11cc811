"""Taking checkpoints while the daemon runs: a marker in the stream, a background write.

The graph is copied in the updater stage exactly between two input records, so the
consume loop never waits for the pipeline to drain; the folder is written by its
own thread (daemon/service/checkpoint.py has the format).
"""

from __future__ import annotations

import threading
import time

from csmd.pipeline.stages import Marker, Pipeline
from csmd.service.checkpoint import write_checkpoint


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


class Checkpointing:
    """The Daemon's part that writes checkpoints."""

    def _checkpoint_state(self, graph, offsets: dict[int, int]) -> dict:
        return {"seq": graph.seq, **self._checkpoint_content(offsets), "written": time.time()}

    def _checkpoint_content(self, offsets: dict[int, int]) -> dict:
        """What a checkpoint at these input offsets holds besides the graph, which the offsets fix:
        equal contents are equal checkpoints."""
        return {"offsets": {str(p): o for p, o in offsets.items()}, "control_applied": self.control_applied,
                "removed": sorted(self.removed), "queries": [dict(vars(s)) for s in self.specs.values()],
                "input": self.cfg["topics"]["input"], "control": self.cfg["topics"]["control"]}

    def _checkpoint_due(self) -> bool:
        """Whether to take a checkpoint now: none is on its way (a marker in the pipeline or a
        writer at work: one at a time, so a slow disk skips intervals; two writers of one sequence
        number would share its folder) and the last written holds something else (an idle daemon
        rewrote an identical one every interval)."""
        busy = self._checkpoint_marker or (self._writer is not None and self._writer.is_alive())
        return not busy and self._checkpoint_content(self._next_offsets) != self._last_checkpoint

    def _take_checkpoint(self) -> None:
        """Send a checkpoint marker down the pipeline (the consume loop, when one is due)."""
        self._checkpoint_marker = True
        self._enqueue_marker(CheckpointMarker(self._next_offsets))

    def _write_in_background(self, marker: CheckpointMarker) -> None:
        """A checkpoint marker reached the output: write it without holding the pipeline."""
        state = self._checkpoint_state(marker.graph, marker.offsets)
        self._writer = threading.Thread(target=self._write_checkpoint, args=(marker.graph, state),
                                        name="csmd-checkpoint", daemon=True)
        self._writer.start()
        self._checkpoint_marker = False  # the writer's thread says it is on its way from here

    def _write_checkpoint(self, graph, state: dict) -> None:
        t0 = time.monotonic()
        c = self.cfg["checkpoint"]
        try:
            path = write_checkpoint(c["dir"], graph, state, c["keep"],
                                    self.cluster.lowest() if self.cluster is not None else None)
        except OSError as exc:  # the previous checkpoint stays; the next interval tries again
            self.log.error("checkpoint failed", dir=c["dir"], reason=exc.strerror or str(exc))
            return
        self._last_checkpoint = content(state)
        self.metrics.inc("csmd_checkpoints_total")
        self.metrics.set("csmd_checkpoint_seq", state["seq"])
        self.log.info("checkpoint written", path=str(path), seq=state["seq"], seconds=round(time.monotonic() - t0, 3))
