"""`csmd replay`: the continuous pipeline over files (the daemon's pipeline, with a file source)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .arrow_writer import delta_batch
from .executor import RegisteredQuery
from .formats import read_updates
from .graph import Graph
from .pipeline import Pipeline
from .progress import Progress
from csmd.schemas import deltas_schema, id_type_of


class DeltaFile:
    """Arrow IPC file of deltas, written batch by batch in update order."""

    def __init__(self, path, mvg):
        self.mvg = mvg
        self._ext = np.array(mvg.ext_ids)
        self.id_type = id_type_of(self._ext)
        self._writer = ipc.new_file(str(path), deltas_schema(self.id_type))

    def ext_ids(self) -> np.ndarray:
        if len(self.mvg.ext_ids) > len(self._ext):  # vertices created by the stream
            self._ext = np.concatenate([self._ext, np.array(self.mvg.ext_ids[len(self._ext):], self._ext.dtype)])
        return self._ext

    def write(self, result) -> None:
        """One batch's deltas in update order (then query, then match): independent of batching."""
        ext = self.ext_ids()
        parts = [delta_batch(d.name, d.sign, d.seq, [result.batch.sources[s] for s in d.seq.tolist()], d.rows, ext)
                 for d in result.deltas if d.rows is not None and len(d.rows)]
        if parts:
            table = pa.Table.from_batches(parts).sort_by("seq")  # stable: keeps query and match order
            self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


def replay(g0: Graph, stream_path, queries: list[tuple[str, Graph]], *, batch_size: int, count_only: bool,
           output=None, threaded: bool = True, show_progress: bool | None = None) -> tuple[list[dict], "Pipeline"]:
    """Run the stream through the pipeline; returns one result dict per query and the pipeline."""
    label_sizes = np.bincount(g0.labels) if g0.n else np.zeros(1, np.int64)
    registered = [RegisteredQuery(name, q, label_sizes, count_only=count_only) for name, q in queries]
    pipe = Pipeline(g0, registered, batch_size=batch_size, threaded=threaded)
    totals = {name: [0, 0] for name, _ in queries}
    progress = Progress(0, "updates", enabled=show_progress)
    if progress.enabled:  # the bar's total costs a read of the whole stream: only when it is drawn
        with open(stream_path, "rb") as f:
            progress.total = sum(1 for _ in f)
    writer = DeltaFile(output, pipe.mvg) if output else None

    def on_result(result):
        for d in result.deltas:
            totals[d.name][0] += d.positive
            totals[d.name][1] += d.negative
        if writer is not None:
            writer.write(result)
        progress.step(result.batch.records)

    t0 = time.monotonic()
    try:
        stats = pipe.run(read_updates(stream_path), on_result)
    finally:
        progress.close()
        if writer is not None:
            writer.close()
    seconds = time.monotonic() - t0
    ignored = dict(pipe.updater.ignored)
    return [{
        "query": name, "positive": pos, "negative": neg, "updates": stats.updates, "records": stats.records,
        "ignored": sum(ignored.values()), "seconds": round(seconds, 6),
    } for name, (pos, neg) in totals.items()], pipe
