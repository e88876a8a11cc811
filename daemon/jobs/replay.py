"""`csmd replay`: the continuous pipeline over files (the daemon's pipeline, with a file source)."""

from __future__ import annotations

import time

from csmd.connectors.files import FileSink, FileSource
from csmd.connectors.records import BadRecord, decode_updates, load_scanner
from csmd.backends import continuous_engine, resolve_backend, warm_once
from csmd.errors import InputError
from csmd.jobs.progress import Progress
from csmd.model.formats import MAX_ID_BYTES, UpdateBlock
from csmd.model.graph import Graph
from csmd.model.labels import NO_NAMES, LabelNames
from csmd.pipeline.deltas import DeltaEncoder, warm_encoder
from csmd.pipeline.event_time import EventTime
from csmd.pipeline.sequencer import LATE
from csmd.pipeline.stages import Pipeline

def file_updates(source: FileSource, str_ids: bool = False, max_id_bytes: int = MAX_ID_BYTES,
                 labels: LabelNames = NO_NAMES, event_time: bool = False):
    """The updates of a stream file in order, runs of plain lines as UpdateBlocks (of integer
    ids: with str_ids, a graph keyed by strings, every line is decoded alone, its ids at most
    max_id_bytes long; a line that names a label is decoded alone, by `labels`); a bad line
    stops the replay with file:line: reason. event_time: every edge line must carry a ts (and
    is decoded alone: blocks hold none)."""
    for item in source.read(blocks=not (str_ids or event_time)):
        if isinstance(item, UpdateBlock):
            yield item
            continue
        try:
            yield from decode_updates(item, "text", str_ids, max_id_bytes, labels=labels, event_time=event_time)
        except BadRecord as exc:
            raise InputError(item.input, item.offset, str(exc)) from None


def read_stream(path, event_time: bool = False) -> list:
    """The whole stream file decoded, in memory (UpdateBlocks and Updates), for replay to time
    the pipeline alone: RapidFlow, the reference, loads its stream before its clock starts."""
    source = FileSource(path)
    try:
        return list(file_updates(source, event_time=event_time))
    finally:
        source.close()


def decoded_updates(path):
    """The updates of a stream file one Update each (blocks expanded): for callers that pace
    or interleave single records (benchmarks, tests)."""
    for item in read_stream(path):
        yield from item.updates() if isinstance(item, UpdateBlock) else (item,)


def replay(g0: Graph, stream, queries: list[tuple[str, Graph]], *, batch_size: int, count_only: bool,
           distinct: bool = False, output=None, threaded: bool = True, show_progress: bool | None = None,
           backend: str = "cpu", executor_lag: int = 0, max_batch: int | None = None,
           max_id_bytes: int = MAX_ID_BYTES, labels: LabelNames = NO_NAMES,
           started: float | None = None, event_time: EventTime | None = None,
           gpus: int | str = 1) -> tuple[list[dict], "Pipeline"]:
    """Run the stream through the pipeline on `backend`; returns one result dict per query and the pipeline.
    stream: a stream file's path (read as the pipeline goes: `seconds` includes reading it), or
    what read_stream made of one (`seconds`: the pipeline alone). threaded: the pipeline's
    stages in threads (small batches still run inline: pipeline/stages.py). `seconds` never includes
    loading g0 into the engine or planning the queries: `setup_seconds` has those, from `started`
    (a time.monotonic(); default: this call) to the stream's start, with the warm-up that loads
    compiled code and builds the queries' tables first (warm_once, Pipeline.warm), so that the
    first batch runs as a later one would. distinct: every query gives one delta per
    subgraph instance (pipeline/queries.py continuous_query). A string id of the stream longer than
    max_id_bytes (UTF-8), or empty, stops it with file:line: reason. labels: the names a stream
    file's lines may give labels by. event_time: the window and lateness of event time
    (pipeline/event_time.py; every edge line then needs a ts); None: off. gpus: the GPU engine's
    devices (a count or "all": gpu/replicas.py)."""
    started = time.monotonic() if started is None else started
    load_scanner()
    warm_once(resolve_backend(backend), gpus)  # before the engine: the GPU's pool keeps what the warm-up freed
    engine = continuous_engine(backend, g0, timed=event_time is not None, gpus=gpus)
    pipe = Pipeline(g0, engine=engine, batch_size=batch_size,
                    threaded=threaded, executor_lag=executor_lag,
                    max_batch=max_batch, event_time=event_time)
    for name, q in queries:
        pipe.add_query(name, q, count_only, distinct)
    pipe.warm()
    totals = {name: [0, 0] for name, _ in queries}
    progress = Progress(0, "updates", enabled=show_progress)
    in_memory = isinstance(stream, list)
    if progress.enabled:  # the bar's total costs a read of the whole stream: only when it is drawn
        if in_memory:
            progress.total = sum(len(x) if isinstance(x, UpdateBlock) else 1 for x in stream)
        else:
            with open(stream, "rb") as f:
                progress.total = sum(1 for _ in f)
    source = None if in_memory else FileSource(stream)
    encoder = DeltaEncoder(pipe.vertices)
    sink = FileSink(output, encoder.schema) if output else None
    if output:  # what the first batch's encoding would load, loaded in the set-up
        warm_encoder(pipe.vertices)

    def on_result(result):  # replay's source yields no markers
        for d in result.deltas:
            totals[d.name][0] += d.positive
            totals[d.name][1] += d.negative
        if sink is not None:
            sink.write(encoder.encode(result, by_update=True))
        progress.step(result.batch.records)

    t0 = time.monotonic()
    try:
        stats = pipe.run(iter(stream) if in_memory else
                         file_updates(source, g0.str_ids, max_id_bytes, labels, event_time is not None), on_result)
    finally:
        progress.close()
        if source is not None:
            source.close()
        if sink is not None:
            sink.close()
        seconds = time.monotonic() - t0  # the stream's deltas are all out; releasing the engine is not its time
        pipe.engine.close()
    ignored = dict(pipe.ignored)
    clock = pipe.sequencer.clock
    return [{
        "query": name, "positive": pos, "negative": neg, "updates": stats.updates, "records": stats.records,
        "ignored": sum(ignored.values()), "seconds": round(seconds, 6),
        "setup_seconds": round(t0 - started, 6), "backend": pipe.engine.name,
        **({"late": ignored.get(LATE, 0), "expired": clock.expired, "watermark": clock.watermark} if clock else {}),
    } for name, (pos, neg) in totals.items()], pipe
