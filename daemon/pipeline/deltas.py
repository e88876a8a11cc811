"""Match deltas as Arrow record batches with deterministic ids (the replay file and the output topic).

A delta's id is (input, partition, offset, query, index): the input record that
caused it and its number among that record's deltas for the query. Its key,
headers and fields are what that record's context carries (Update.context).
Deltas leave the executor in a fixed order (by update, then by match), so the same delta gets
the same id in every run, whatever the batching, and a consumer can drop the
duplicates that a restart after a crash re-sends.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from csmd.pipeline.sequencer import BlockRecords
from csmd.schemas import deltas_schema

from csmd.model.graph import id_array
from csmd.model.time_constraints import NO_TS

# A batch's deltas leave the encoder in pieces (record batches) of at most MAX_ROWS rows, so that
# their Arrow form takes bounded memory (some 200 bytes a row) however many deltas a batch has;
# and of at most MAX_VALUES vertex ids, the most a list array's int32 offsets can address. Both are
# module constants so that tests can force small pieces.
MAX_ROWS = 1 << 20
MAX_VALUES = (1 << 31) - 1
MAX_STRING_BYTES = (1 << 31) - 1  # of a string column of one piece: its int32 offsets' reach
SMALL_PIECE = 256  # rows: pieces up to this size reuse their all-null and empty columns (DeltaEncoder._constant)
PARALLEL_ROWS = 1 << 16  # rows: larger pieces build their string and vertex columns on threads (_side_by_side)


class DeltaEncoder:
    """Turns each batch's deltas into record batches: per query in update order, or the whole batch by update."""

    def __init__(self, vertices, carry=None):
        self.vertices = vertices  # the sequencer's vertex table
        # its ids as an array to gather matches from: int64, or objects for string ids (never
        # fixed-width unicode, which cut ids made by the stream to the initial graph's longest);
        # grown by doubling as the stream makes vertices, the first _n of it filled
        self._ext = id_array(vertices.ext_ids, vertices.str_ids)
        self._n = len(self._ext)
        self.id_type = pa.string() if vertices.str_ids else pa.int64()
        # the names of the carried headers and fields (connectors.records.Carry; None: none)
        self.carry_headers, self.carry_fields = (carry.headers, carry.fields) if carry is not None else ((), ())
        self.schema = deltas_schema(self.id_type)
        self._map_types = (self.schema.field("headers").type, self.schema.field("fields").type)
        # per query: the origin of its last delta and the next index for that origin; an
        # input record's updates may span two batches, so its numbering carries over (from one
        # result to the next in stream order only: a gained shard's re-match goes back to records
        # numbered before, from their start, and the stream after it goes on from the last batch)
        self._last: dict[str, tuple[tuple, int]] = {}
        self._columns: dict[tuple, object] = {}  # _constant's

    def ext_ids(self) -> np.ndarray:
        """Every vertex's id by internal id (and unfilled room past them: matches never name it)."""
        ext_ids, n = self.vertices.ext_ids, self._n
        m = len(ext_ids)  # once: the updater may add vertices meanwhile (the encoder may run on another thread)
        if m > n:  # vertices created by the stream
            if m > len(self._ext):
                grown = np.empty(max(m, 2 * n), self._ext.dtype)
                grown[:n] = self._ext[:n]
                self._ext = grown
            self._ext[n:m] = ext_ids[n:m]
            self._n = m
        return self._ext

    def encode(self, result, by_update: bool = False) -> Iterator[tuple[str | None, pa.RecordBatch, list[tuple]]]:
        """The batch's deltas as (query, record batch, origins in it), built one piece at a time
        as the caller takes them, so that a batch's Arrow form is never all in memory: each piece
        at most MAX_ROWS rows and MAX_VALUES vertex ids. By query (the output topic's records,
        keyed by query), or by_update: in the file's order, by update, then query, then match
        (query None). The ids are numbered here, before the first piece is taken."""
        runs = self._runs(result)
        return iter(()) if runs is None else runs.pieces(self, by_update)

    def _runs(self, result) -> _Runs | None:
        """The batch's deltas as runs, by query then update (None: no deltas)."""
        parts = [d for d in result.deltas if len(d.seq)]
        if not parts:
            return None
        starts = [_run_starts(d.seq) for d in parts]  # a query's rows are in update order
        part = np.repeat(np.arange(len(parts)), [len(x) for x in starts])
        lo = np.concatenate(starts)
        hi = np.concatenate([np.append(x[1:], len(d.seq)) for x, d in zip(starts, parts)])
        # the distinct updates (far fewer than the rows: every query's deltas of an update name it),
        # their records, and a code per distinct origin
        useq, upd = np.unique(np.concatenate([d.seq[x] for x, d in zip(starts, parts)]), return_inverse=True)
        upd = upd.reshape(-1)  # numpy 2 may shape it like its input
        ucode, origins, usource, contexts = _records(result.batch.record_of, useq)
        code = ucode[upd]
        # index: a row's position within its query's run of equal origins (runs of rows of one
        # update, then of consecutive ones of one record), continuing the run that the query's
        # previous batch ended with
        n = hi - lo
        new = np.ones(len(lo), bool)
        new[1:] = (part[1:] != part[:-1]) | (code[1:] != code[:-1])
        group = np.cumsum(new) - 1
        before = np.cumsum(n) - n
        index = before - before[new][group]
        first = np.searchsorted(part, np.arange(len(parts) + 1))  # query i's runs: first[i]:first[i + 1]
        carry = np.zeros(len(new), np.int64)  # per group
        for i, d in enumerate(parts if result.follows else ()):  # a re-match neither reads nor moves the carry
            f, last = first[i], first[i + 1] - 1
            last_origin, count = self._last.get(d.name, (None, 0))
            if origins[code[f]] == last_origin:
                carry[group[f]] = count
            self._last[d.name] = (origins[code[last]], int(index[last] + carry[group[last]] + n[last]))
        index += carry[group]
        return _Runs(parts, part, lo, hi, first, useq, upd, code, index, origins, usource, contexts)

    def _constant(self, k: int, what: str, make):
        """Columns that depend only on the number of rows k (all null, no vertices), made once for
        each small k: a Kafka record of a few deltas paid some 25 us for building them again."""
        if k > SMALL_PIECE:
            return make()
        key = (k, what)
        got = self._columns.get(key)
        if got is None:
            got = self._columns[key] = make()
        return got

    def _context(self, contexts: list | None, upd: np.ndarray, n: np.ndarray) -> list[pa.Array]:
        """The key, headers and fields columns of the rows of runs of n rows of updates upd, from
        the contexts of the distinct updates (None: none has one, the common case: no step per
        update)."""
        headers, fields = self._map_types
        if contexts is None:
            k = int(n.sum())
            return list(self._constant(k, "context", lambda: (
                pa.nulls(k, pa.binary()), _maps(self.carry_headers, None, k, headers),
                _maps(self.carry_fields, None, k, fields))))
        cs = [c or (None, None, None) for c in contexts]
        inv = np.repeat(upd, n)
        return [col.take(inv) for col in (
            pa.array([c[0] for c in cs], pa.binary()), _maps(self.carry_headers, [c[1] for c in cs], len(cs), headers),
            _maps(self.carry_fields, [c[2] for c in cs], len(cs), fields))]


class _Runs:
    """A batch's deltas as runs: a query's rows of one update, parts[part[r]]'s rows lo[r]:hi[r],
    by query then update (query i's runs are first[i]:first[i + 1]). Each run's update (upd:
    into the distinct updates useq, whose sources are usource and contexts contexts), its origin
    (code: into origins) and the index of its first row. Every column of the deltas is a copy
    or a repeat of slices of these: no step per row outside compiled code."""

    def __init__(self, parts, part, lo, hi, first, useq, upd, code, index, origins, usource, contexts):
        self.parts, self.part, self.lo, self.hi, self.first = parts, part, lo, hi, first
        self.useq, self.upd, self.code, self.index = useq, upd, code, index
        self.origins, self.contexts = origins, contexts
        self.sign = np.concatenate([d.sign[lo[first[i]: first[i + 1]]] for i, d in enumerate(parts)])
        self.width = np.array([0 if d.rows is None else d.rows.shape[1] for d in parts], np.int64)  # ids a row
        self.timed = any(d.ts is not None for d in parts)
        self.names = _strings(pa.array([d.name for d in parts], pa.string()))
        self.sources = _strings(usource)
        # each origin's input, partition and offset, which the runs take by their code
        self.inputs = _strings(pa.array([o[0] for o in origins], pa.string()))
        self.partitions = np.array([o[1] for o in origins], np.int32)
        self.offsets = np.array([o[2] for o in origins], np.int64)

    def pieces(self, enc: DeltaEncoder, by_update: bool):
        if by_update:  # stable: the queries' order within an update
            yield from self._pieces(enc, np.argsort(self.upd, kind="stable"), None)
            return
        for i, d in enumerate(self.parts):
            yield from self._pieces(enc, np.arange(self.first[i], self.first[i + 1]), d.name)

    def _pieces(self, enc: DeltaEncoder, order: np.ndarray, name: str | None):
        """(name, record batch, origins) of the rows of the runs `order`, in that order, cut into
        consecutive pieces of at most MAX_ROWS rows and MAX_VALUES vertex ids."""
        n = (self.hi - self.lo)[order]
        width = self.width[self.part[order]]
        rows, ids = np.cumsum(n), np.cumsum(n * width)  # up to each run's end
        total, r0 = int(rows[-1]), 0
        while r0 < total:
            s = np.searchsorted(rows, r0, "right")  # row r0's run
            limit = int(ids[s] - (rows[s] - r0) * width[s]) + MAX_VALUES  # the ids before r0, and a piece's
            t = np.searchsorted(ids, limit, "right")  # the first run past the limit: some of its rows fit
            r1 = total if t == len(n) else int(rows[t] - n[t] + (limit - (ids[t] - n[t] * width[t])) // width[t])
            r1 = min(r0 + MAX_ROWS, r1)
            runs = order[s: np.searchsorted(rows, r1 - 1, "right") + 1]  # the piece's, the first and last cut
            lo, hi, index = self.lo[runs], self.hi[runs], self.index[runs]  # copies
            cut = r0 - int(rows[s] - n[s])
            lo[0] += cut
            index[0] += cut
            hi[-1] -= rows[s + len(runs) - 1] - r1
            yield name, self._batch(enc, runs, lo, hi, index), self._origins(self.code[runs])
            r0 = r1

    def _origins(self, code: np.ndarray) -> list[tuple]:
        """The distinct origins of runs of these codes, in their order."""
        return [self.origins[x] for x in code[np.append(True, code[1:] != code[:-1])].tolist()]

    def _batch(self, enc: DeltaEncoder, runs, lo, hi, index) -> pa.RecordBatch:
        """The record batch of the rows lo:hi of the runs `runs`, the first numbered index. A large
        piece's string and vertex columns are built on threads side by side (their fills release
        the GIL): they were most of the encoder's time, a piece's bytes copied one column at a time."""
        n = hi - lo
        k = int(n.sum())
        at = np.cumsum(n) - n  # each run's first row in the batch
        part, upd, code = self.part[runs], self.upd[runs], self.code[runs]
        names, sources, vertices, inputs = _side_by_side(k, (
            lambda: _repeated(self.names, part, n), lambda: _repeated(self.sources, upd, n),
            lambda: self._vertices(enc, part, lo, hi), lambda: _repeated(self.inputs, code, n)))
        return pa.record_batch([
            names,
            pa.array(np.repeat(self.sign[runs], n), pa.int8()),
            pa.array(np.repeat(self.useq[upd], n), pa.int64()),
            sources,
            vertices,
            pa.array(self._counts(part, lo, hi, at, k), pa.int64()),
            inputs,
            pa.array(np.repeat(self.partitions[code], n), pa.int32()),
            pa.array(np.repeat(self.offsets[code], n), pa.int64()),
            pa.array(np.arange(k, dtype=np.int64) + np.repeat(index - at, n), pa.int64()),
            *enc._context(self.contexts, upd, n),
            *self._ts(enc, part, lo, hi, at, k),
        ], schema=enc.schema)

    def _vertices(self, enc: DeltaEncoder, part, lo, hi) -> pa.Array:
        """The rows' matches as a list array of external ids, copied run by run."""
        width = self.width[part]
        if not width.any():  # count-only queries' rows: empty lists
            k = int((hi - lo).sum())
            return enc._constant(k, "vertices", lambda: pa.ListArray.from_arrays(
                np.zeros(k + 1, np.int32), pa.array([], enc.id_type), pa.list_(enc.id_type)))
        offsets = np.zeros(int((hi - lo).sum()) + 1, np.int32)
        np.cumsum(np.repeat(width.astype(np.int32), hi - lo), out=offsets[1:])
        ext = enc.ext_ids()  # string ids are objects, which numba cannot copy: internal ids first
        values = np.empty(int(offsets[-1]), np.int32 if ext.dtype == object else ext.dtype)
        at = offsets[np.cumsum(hi - lo) - (hi - lo)]
        for p in np.unique(part[width > 0]).tolist():
            mine, w = part == p, int(self.width[p])
            _copy(self.parts[p].rows.reshape(-1), lo[mine] * w, hi[mine] * w, at[mine],
                  _NO_TABLE if ext.dtype == object else ext, values)
        return pa.ListArray.from_arrays(offsets, pa.array(ext[values] if ext.dtype == object else values, enc.id_type),
                                        pa.list_(enc.id_type))

    def _counts(self, part, lo, hi, at, k: int) -> np.ndarray:
        """The count column: 1 a match, a count-only query's counts copied run by run."""
        out = np.ones(k, np.int64)
        for p in np.unique(part).tolist():
            if self.parts[p].rows is None:
                mine = part == p
                _copy(self.parts[p].counts, lo[mine], hi[mine], at[mine], _NO_TABLE, out)
        return out

    def _ts(self, enc: DeltaEncoder, part, lo, hi, at, k: int) -> list[pa.Array]:
        """The ts_min and ts_max columns, null where a match has no ts (NO_TS); without ts, one
        array of nulls for both (no numpy pass over the rows)."""
        if not self.timed:
            none = enc._constant(k, "ts", lambda: pa.nulls(k, pa.int64()))
            return [none, none]
        out = []
        for c in (0, 1):
            values = np.full(k, NO_TS, np.int64)
            for p in np.unique(part).tolist():
                ts = self.parts[p].ts
                if ts is not None:
                    mine = part == p
                    _copy(ts[:, c], lo[mine], hi[mine], at[mine], _NO_TABLE, values)
            valid = values != NO_TS
            # the validity bitmap packed by numpy: pa.array(values, mask=...) took five times as long
            bits = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
            out.append(pa.Array.from_buffers(pa.int64(), k, [bits, pa.py_buffer(values)]))
        return out


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """_side_by_side's threads, made on first use."""
    return ThreadPoolExecutor(4, thread_name_prefix="csmd-encode")


def _side_by_side(rows: int, makers) -> list:
    """Each maker's result: called here for a piece of up to PARALLEL_ROWS rows, else on threads."""
    if rows <= PARALLEL_ROWS:
        return [make() for make in makers]
    return [f.result() for f in [_pool().submit(make) for make in makers]]


def warm_encoder(vertices) -> list[pa.RecordBatch]:
    """A throwaway encoder's record batches, by query and by update, for a batch of two records with
    a count-only query's deltas and (where there is a vertex to name) a materialised one's: what
    the first batch's encoding would load on first use loads here (the compiled column fills:
    numba's cache, or its compiler where there is none, 0.1-0.2 s each; pyarrow's lazy imports)."""
    from csmd.engine import QueryDeltas, UpdateBatch
    from csmd.model.formats import Update
    from csmd.pipeline.stages import BatchResult

    z, seq, ones = np.zeros(0, np.int64), np.arange(2, dtype=np.int64), np.ones(2, np.int8)
    records = {i: Update("e", i, i + 1, source=f"warm-up {i}", origin=("warm-up", 0, i)) for i in range(2)}
    batch = UpdateBatch(0, 2, z, z, z, z, z, z, z, z, np.zeros(0, np.int32), 0, records, np.zeros(2), 2)
    deltas = [QueryDeltas("warm-up", seq, ones, None, 2, 0, np.ones(2, np.int64))]
    if len(vertices.ext_ids):  # a match's rows name vertex 0
        deltas.append(QueryDeltas("warm-up rows", seq, ones, np.zeros((2, 2), np.int32), 2, 0))
    result = BatchResult(batch, deltas, 0.0)
    return [rb for by_update in (False, True) for _q, rb, _o in DeltaEncoder(vertices).encode(result, by_update)]


def _run_starts(seq: np.ndarray) -> np.ndarray:
    """Where each run of equal values of seq starts."""
    new = np.empty(len(seq), bool)
    new[:1] = True
    np.not_equal(seq[1:], seq[:-1], out=new[1:])
    return np.flatnonzero(new)


def _strings(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow string array's offsets and bytes, as numpy views of its buffers."""
    _, offsets, data = arr.buffers()
    return (np.frombuffer(offsets, np.int32)[arr.offset: arr.offset + len(arr) + 1],
            np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8))


def _repeated(strings: tuple[np.ndarray, np.ndarray], codes: np.ndarray, n: np.ndarray) -> pa.Array:
    """A string array of n[r] times string codes[r] of `strings` (_strings) for each run r."""
    offsets, data = strings
    lo, hi = offsets[codes], offsets[codes + 1]
    if int(((hi - lo) * n).sum()) > MAX_STRING_BYTES:
        raise OverflowError(f"{int(n.sum())} deltas hold over {MAX_STRING_BYTES} bytes of one string column")
    if len(codes) == 1:  # one string (a small batch's usual piece): no compiled call
        k, text = int(n[0]), data[lo[0]: hi[0]].tobytes()
        return pa.Array.from_buffers(pa.string(), k, [None, pa.py_buffer(np.arange(k + 1, dtype=np.int32) * len(text)),
                                                      pa.py_buffer(text * k)])
    out_offsets = np.zeros(int(n.sum()) + 1, np.int32)
    np.cumsum(np.repeat(hi - lo, n), out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), np.uint8)
    _repeat(data, lo, hi, n, out)
    return pa.Array.from_buffers(pa.string(), len(out_offsets) - 1, [None, pa.py_buffer(out_offsets),
                                                                     pa.py_buffer(out)])


def _numpy_copy(src, lo, hi, at, table, out) -> None:
    """gather.copy_runs without numba."""
    n = hi - lo
    into = np.repeat(at - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
    got = src[np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))]
    out[into] = table[got] if len(table) else got


def _numpy_repeat(src, lo, hi, times, out) -> None:
    """gather.repeat_runs without numba."""
    for a, b, t in zip(lo.tolist(), hi.tolist(), times.tolist()):
        out[: (b - a) * t] = np.tile(src[a:b], t)
        out = out[(b - a) * t:]


try:
    from csmd.pipeline.gather import copy_runs as _copy, repeat_runs as _repeat
except ImportError:  # no numba: the same in numpy, several passes over the values
    _copy, _repeat = _numpy_copy, _numpy_repeat

_NO_TABLE = np.zeros(0, np.int64)  # _copy's table: the values themselves


_NO_ENTRIES: dict = {}  # per map type, its empty entries


def _maps(names: tuple, values: list | None, m: int, typ: pa.MapType) -> pa.Array:
    """m maps, each of every one of `names` to its value in values[i] (a tuple in names' order;
    None, or values None: all null). Built from buffers: MapArray.from_arrays took some 20 us, more
    than the rest of a batch of a few deltas."""
    k = len(names)
    entries = _NO_ENTRIES.get(typ) if not k else None  # no names carried, the common case: nothing to build
    if entries is None:
        items = [x for row in values for x in (row or (None,) * k)] if values is not None else [None] * (m * k)
        entries = pa.StructArray.from_arrays([pa.array(list(names) * m, pa.string()), pa.array(items, typ.item_type)],
                                             fields=[typ.key_field, typ.item_field])
        if not k:
            _NO_ENTRIES[typ] = entries
    return pa.Array.from_buffers(typ, m, [None, pa.py_buffer(np.arange(m + 1, dtype=np.int32) * k)],
                                 children=[entries])


def _records(record_of, useq: np.ndarray) -> tuple[np.ndarray, list[tuple], pa.Array, list | None]:
    """For distinct updates (sorted): a code per update naming its input record, each code's
    origin, each update's source, and each update's context (None: no update has one). A batch
    cut from a block reads them from its columns (no Update made: a batch can have deltas for
    thousands of updates, each in every instance of a cluster)."""
    if isinstance(record_of, BlockRecords):  # rows in update order, a record's rows together
        block = record_of.block
        rows = useq - record_of.first
        at = block.lineno[rows]
        first = np.diff(at, prepend=-1) != 0  # a record's first update (offsets and lines are >= 0)
        contexts = [block.context.get(x) for x in at.tolist()] if block.context else None
        return (np.cumsum(first) - 1, [(block.path, block.partition, x) for x in at[first].tolist()],
                block.sources(rows), contexts)
    urecs = [record_of[s] for s in useq.tolist()]
    codes: dict = {}
    code = np.array([codes.setdefault(r.origin, len(codes)) for r in urecs], np.int64)
    contexts = [r.context for r in urecs]
    return code, list(codes), pa.array([r.source for r in urecs], pa.string()), \
        contexts if any(c is not None for c in contexts) else None
