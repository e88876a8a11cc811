"""Input records and how update records are decoded from their bytes.

An input record (a Kafka message, or one line of a stream file) holds one or
more updates as Arrow IPC (a stream or file of rows in the updates schema),
JSON (one object or an array of objects with op, u, v, label, ts; other fields and
columns are allowed, and carried into the deltas where Carry names them) or text lines
in the stream format (`e u v [label [ts]]`, `-e u v [label [ts]]`, `v id label`, `-v id`).
The format is fixed by configuration or, with `auto`, recognised per record
from its content-type header or its first bytes. A record is decoded whole or
refused whole with a reason: the daemon sends a refused record to the
dead-letter topic and goes on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from csmd.errors import InputError
from csmd.model.formats import (DELETE_EDGE, DELETE_VERTEX, INSERT_EDGE, INSERT_VERTEX, MAX_ID_BYTES, TS_NEEDED,
                                Update, UpdateBlock, arrow_integer, arrow_text, id_problem, in_int64, parse_update,
                                text_array, ts_problem)
from csmd.model.labels import MAX_LABEL, NO_NAMES, LabelNames, unknown_label
from csmd.schemas import ARROW_STREAM, CONTENT_TYPE, JSON, TEXT

try:
    from .textscan import scan, scan_records
except ImportError:  # no numba: every record is decoded on its own
    scan = scan_records = None

FORMATS = ("auto", "arrow", "json", "text")
_CONTENT_TYPES = {ARROW_STREAM: "arrow", "application/vnd.apache.arrow.file": "arrow", JSON: "json", TEXT: "text"}
_OPS = (INSERT_EDGE, DELETE_EDGE, INSERT_VERTEX, DELETE_VERTEX)


@dataclass(slots=True)
class Record:
    """One input record: where it is (input topic or file, partition, offset) and its bytes.
    Slots, and its name for people made only when asked for: every instance of a cluster makes
    one of these for every input record."""

    input: str
    partition: int
    offset: int
    value: bytes
    # as Kafka gives them, (key, value or None) in order, a key possibly more than once: a dead letter
    # carries them unchanged
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    where: str = ""  # for people, when not topic/partition/offset (a file's name:line)
    key: bytes | None = None  # the Kafka message key (every delta of the record carries it)

    def header(self, key: str) -> bytes | None:
        """The value of the last header named `key` (None if there is none, or it has no value)."""
        return next((v for k, v in reversed(self.headers) if k == key), None)

    @property
    def source(self) -> str:
        return self.where or f"{self.input}/{self.partition}/{self.offset}"

    @property
    def origin(self) -> tuple[str, int, int]:
        return (self.input, self.partition, self.offset)


@dataclass(frozen=True)
class Carry:
    """What of an input record the deltas it causes carry besides its key ([output] carry_headers,
    carry_fields): the values of these headers, and per update those of these fields of its JSON
    object or columns of its Arrow row. An update's context (Update.context) is (key, the headers'
    values, the fields' values as JSON text), or None when it has nothing to carry: then it costs
    nothing per update. A record whose context takes more than max_bytes is refused: a delta row
    that cannot be published would stop the daemon, at every restart again."""

    headers: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    max_bytes: int = 1 << 62

    def record(self, key: bytes | None, headers) -> tuple | None:
        """(key, the carried headers' values) of a record, None when it has neither to carry."""
        if not self.headers:
            return None if key is None else (key, None)
        last = dict(headers or ())  # a header given twice: its last value, as Record.header reads it
        return (key, tuple(last.get(h) for h in self.headers))

    def update(self, base: tuple | None, values=None) -> tuple | None:
        """The context of an update of a record whose record() is `base`; `values` (JSON and Arrow
        updates) maps field names to its values, null or absent ones being null."""
        if not self.fields or values is None:
            context = None if base is None else base + (None,)
        else:
            fields = tuple(None if (x := values.get(f)) is None else json.dumps(x, default=str) for f in self.fields)
            context = (base or (None, None)) + (fields,)
        if context is not None:
            key, headers, fields = context
            size = len(key or b"") + sum(len(x) for x in (*(headers or ()), *(fields or ())) if x is not None)
            if size > self.max_bytes:
                raise BadRecord(f"its key, carried headers and fields take {size} bytes, more than the "
                                f"{self.max_bytes} a delta can carry (half of [topics] max_message_bytes)")
        return context


NO_CARRY = Carry()


class BadRecord(Exception):
    """A record that cannot be decoded; str() is the reason (for the dead-letter header)."""


@dataclass(frozen=True)
class RecordBlock(UpdateBlock):
    """Consecutive input records of one partition, in columns: row i is an Update that
    decode_updates makes of record (path, partition, lineno[i]): `path` is the input, `lineno`
    the records' offsets (repeated for a record of several updates, `part` their lines)."""

    def _prefix(self) -> str:
        return f"{self.path}/{self.partition}/"

    def source(self, i: int) -> str:
        line = 0 if self.part is None else self.part[i]
        return super().source(i) + (f"#{line}" if line else "")

    def sources(self, rows: np.ndarray) -> pa.Array:
        out = super().sources(rows)
        if self.part is None:
            return out
        line = self.part[rows]
        return pc.if_else(pa.array(line != 0), pc.binary_join_element_wise(out, text_array(line), "#"), out)

    def records(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The records' offsets, and how many updates each holds (None: one each)."""
        if self.part is None:
            return self.lineno, None
        first = np.flatnonzero(np.diff(self.lineno, prepend=-1))
        return self.lineno[first], np.diff(np.append(first, len(self.lineno)))


@dataclass(slots=True)
class Polled:
    """A poll's records of one input, in columns, made into Records only where one is needed:
    every instance of a cluster takes in every input record, and an object per record cost
    more than decoding it. Iterating gives the Records."""

    input: str
    partition: list[int]
    offset: list[int]
    value: list[bytes]
    headers: list  # per record: its headers as (key, value) pairs, or None
    key: list | None = None  # per record: its Kafka key or None (None: no record has one)

    def __len__(self) -> int:
        return len(self.offset)

    def record(self, i: int) -> Record:
        h = self.headers[i]
        return Record(self.input, self.partition[i], self.offset[i], self.value[i], list(h) if h else [],
                      key=None if self.key is None else self.key[i])

    def records(self, lo: int = 0, hi: int | None = None) -> list[Record]:
        return [self.record(i) for i in range(lo, len(self) if hi is None else hi)]

    def __iter__(self):
        return iter(self.records())


def plain_runs(polled: Polled, fmt: str = "auto", str_ids: bool = False, carry: Carry = NO_CARRY):
    """A poll's records of one input partition, in order: runs of records of plain update lines
    (connectors/textscan.py) as RecordBlocks, decoded in one compiled pass, and every other
    record as a Record, for decode_updates. A block's rows are the updates that decode_updates
    would make of its records, with their records' context (`carry`); with a declared content
    type, another input format, string ids or without numba, every record is left to decode_updates."""
    if scan_records is None or fmt not in ("auto", "text") or str_ids or not len(polled):
        yield from polled
        return
    values = polled.value
    ends = np.cumsum([len(v) for v in values])
    count, part, op, u, v, label = scan_records(np.frombuffer(b"".join(values), np.uint8), ends)
    first_row = np.concatenate(([0], np.cumsum(np.maximum(count, 0))))  # where each record's rows start
    taken = count > 0
    for i, h in enumerate(polled.headers):
        if h and any(k == CONTENT_TYPE for k, _v in h):
            taken[i] = False
    keyed = polled.key is not None and polled.key.count(None) < len(polled.key)
    contexts = None
    if keyed or carry.headers:  # else no record has a context: no step per record
        contexts = [None] * len(polled)
        for i, (k, h) in enumerate(zip(polled.key if keyed else repeat(None), polled.headers)):
            try:
                contexts[i] = carry.update(carry.record(k, h))
            except BadRecord:  # decode_updates refuses it, with the reason
                taken[i] = False
    offsets = np.asarray(polled.offset, np.int64)
    cuts = np.flatnonzero(np.diff(taken, prepend=False, append=False)).tolist()  # where runs start and end
    done = 0
    for lo, hi in zip(cuts[::2], cuts[1::2]):
        yield from polled.records(done, lo)
        rows, n = slice(int(first_row[lo]), int(first_row[hi])), count[lo:hi]
        context = None if contexts is None else \
            ({o: c for o, c in zip(polled.offset[lo:hi], contexts[lo:hi]) if c is not None} or None)
        yield RecordBlock(polled.input, np.repeat(offsets[lo:hi], n), op[rows], u[rows], v[rows], label[rows],
                          partition=polled.partition[lo], part=part[rows] if (n > 1).any() else None, context=context)
        done = hi
    yield from polled.records(done)


def load_scanner() -> float:
    """Load the compiled scanners (numba's cache) now, not in the first poll or the first read of
    a stream file (some 0.2 s: the first compiled function loaded also sets up numba): plain_runs'
    and FileSource.read's. Returns its seconds."""
    t0 = time.monotonic()
    if scan_records is not None:
        buf = np.frombuffer(b"e 1 2\ne 2 3", np.uint8)
        scan_records(buf, np.array([11], np.int64))
        scan(buf, 0, 1)
    return time.monotonic() - t0


def sniff(value: bytes) -> str:
    """What the bytes look like: arrow (IPC stream or file magic), json, or text."""
    if value[:4] == b"\xff\xff\xff\xff" or value[:6] == b"ARROW1":
        return "arrow"
    head = value.lstrip()[:1]
    return "json" if head in (b"{", b"[") else "text"


def decode_updates(rec: Record, fmt: str = "auto", str_ids: bool = False, max_id_bytes: int = MAX_ID_BYTES,
                   carry: Carry = NO_CARRY, labels: LabelNames = NO_NAMES, event_time: bool = False) -> list[Update]:
    """The updates of one record, in order; BadRecord with the reason if any part is wrong.

    `str_ids`: vertex ids are strings (the graph was keyed by strings), else integers; a string id
    is neither empty nor longer than `max_id_bytes` in UTF-8 ([graph] max_id_bytes).
    `carry`: what of the record its updates' deltas carry (Update.context). Fields other than
    op, u, v and label (JSON) or columns (Arrow) are allowed: carried if named there, else ignored.
    `labels`: the names that may stand for labels (a JSON or Arrow label may be a string then).
    An edge update's event time is its `ts` (JSON field, Arrow column, after a text line's label);
    `event_time`: every edge update must have one (a vertex update's is ignored).
    """
    if rec.value is None or not len(rec.value):
        raise BadRecord("empty record")
    declared = rec.header(CONTENT_TYPE)
    if declared is not None:
        declared = declared.decode("utf-8", "replace").split(";")[0].strip()
        if declared not in _CONTENT_TYPES:
            raise BadRecord(f"unknown content-type {declared!r}")
        declared = _CONTENT_TYPES[declared]
    seen = sniff(rec.value)
    want = fmt if fmt != "auto" else declared or seen
    if declared is not None and declared != want:
        raise BadRecord(f"content-type says {declared} but the input format is {want}")
    if seen != want and not (want == "text" and seen == "json"):
        raise BadRecord(f"expected {'an' if want == 'arrow' else 'a'} {want} record, the bytes look like {seen}")
    try:
        ups = _DECODERS[want](rec, str_ids, max_id_bytes, carry, labels, event_time)
    except BadRecord:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the bytes make a parser raise is the record's fault, never the daemon's
        raise BadRecord(f"undecodable {want} record: {type(exc).__name__}: {exc}") from None
    if not ups:
        raise BadRecord("record holds no updates")
    if len(ups) == 1 and ups[0].source != rec.source:  # the record's position says it all
        ups[0] = replace(ups[0], source=rec.source)
    return ups


def _update(rec: Record, i, where: str, op, u, v, label, str_ids: bool, max_id_bytes: int, context: tuple | None,
            labels: LabelNames, ts=None, event_time: bool = False) -> Update:
    """Update number i (None: the record's only one) from decoded fields, checked; `where`
    names the row or element in errors."""
    if op not in _OPS:
        raise BadRecord(f"{where}: unknown op {op!r} (expected e, -e, v or -v)")
    id_type = str if str_ids else int
    ids = (u,) if op in (INSERT_VERTEX, DELETE_VERTEX) else (u, v)
    for x in ids:
        if x is None:
            raise BadRecord(f"{where}: op {op!r} needs {'u' if op in (INSERT_VERTEX, DELETE_VERTEX) else 'u and v'}")
        if type(x) is not id_type:  # bool is an int subclass: refused too
            raise BadRecord(f"{where}: vertex id {x!r} is not {'a string' if str_ids else 'an integer'}")
        if not str_ids and not in_int64(x):  # JSON integers and Arrow uint64 columns have no such bound
            raise BadRecord(f"{where}: vertex id {x} out of range (int64: -2^63 .. 2^63-1)")
        problem = str_ids and id_problem(x, max_id_bytes)
        if problem:
            raise BadRecord(f"{where}: {problem}")
    if op == INSERT_VERTEX and label is None:
        raise BadRecord(f"{where}: op 'v' needs a label")
    if type(label) is str:
        names, what = (labels.vertex, "vertex label") if op == INSERT_VERTEX else (labels.edge, "edge label")
        if label not in names:
            raise BadRecord(f"{where}: {unknown_label(label, names, what)}")
        label = names[label]
    label = 0 if label is None else label
    if type(label) is not int or not 0 <= label <= MAX_LABEL:
        raise BadRecord(f"{where}: label {label!r} is not an integer in 0 .. 2^31-1")
    if len(ids) == 1:
        ts = None  # a vertex update has no event time
    elif ts is not None and ts_problem(ts):
        raise BadRecord(f"{where}: {ts_problem(ts)}")
    elif ts is None and event_time:
        raise BadRecord(f"{where}: no ts: {TS_NEEDED}")
    source = rec.source if i is None else f"{rec.source}#{i}"
    return Update(op, u, v if len(ids) == 2 else -1, label, source, rec.origin, context, ts)


def _json(rec: Record, str_ids: bool, max_id_bytes: int, carry: Carry, labels: LabelNames,
          event_time: bool) -> list[Update]:
    try:
        doc = json.loads(rec.value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRecord(f"not valid JSON: {exc}") from None
    items = doc if isinstance(doc, list) else [doc]
    base = carry.record(rec.key, rec.headers)
    out = []
    for i, item in enumerate(items):
        where = f"element {i}" if isinstance(doc, list) else "record"
        if not isinstance(item, dict):
            raise BadRecord(f"{where}: expected a JSON object, got {type(item).__name__}")
        if "op" not in item:
            raise BadRecord(f"{where}: field 'op' missing")
        if item["op"] in (INSERT_VERTEX, DELETE_VERTEX) and item.get("v") is not None:  # a mistake, not to be ignored
            raise BadRecord(f"{where}: op {item['op']!r} takes no v (got {item['v']!r})")
        out.append(_update(rec, i if isinstance(doc, list) else None, where,
                           item["op"], item.get("u"), item.get("v"), item.get("label"), str_ids, max_id_bytes,
                           carry.update(base, item), labels, item.get("ts"), event_time))
    return out


def _text(rec: Record, str_ids: bool, max_id_bytes: int, carry: Carry, labels: LabelNames,
          event_time: bool) -> list[Update]:
    try:
        text = rec.value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 text: {exc}") from None
    lines = text.splitlines()
    # one Update per line, made with its final source: the record's own when it is one line
    one = len(lines) == 1
    out = []
    for lineno, line in enumerate(lines, 1):
        try:
            upd = parse_update(line, rec.source, lineno, rec.source if one else f"{rec.source}#{lineno}", rec.origin,
                               str_ids, max_id_bytes, labels, event_time)
        except InputError as exc:
            raise BadRecord(exc.reason if one else f"line {lineno}: {exc.reason}") from None
        if upd is not None:
            out.append(upd)
    context = carry.update(carry.record(rec.key, rec.headers))  # a text update has no fields
    return out if context is None else [replace(u, context=context) for u in out]


def _arrow(rec: Record, str_ids: bool, max_id_bytes: int, carry: Carry, labels: LabelNames,
           event_time: bool) -> list[Update]:
    try:
        reader = ipc.open_file(pa.BufferReader(rec.value)) if rec.value[:6] == b"ARROW1" else \
            ipc.open_stream(pa.BufferReader(rec.value))
        table = reader.read_all()
        table.validate(full=True)  # offsets and lengths: reading unchecked buffers can crash the process
    except (pa.ArrowInvalid, OSError) as exc:
        raise BadRecord(f"not a readable Arrow IPC message: {exc}") from None
    names = table.column_names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadRecord(f"Arrow record: column(s) {', '.join(twice)} more than once")
    for need in ("op", "u"):
        if need not in names:
            raise BadRecord(f"Arrow record: missing column {need!r} (has {', '.join(names)})")
    # ids, op and label names of any string kind (large_string, string_view: Polars' default) or
    # through a dictionary; to_pylist() reads them all as Python values
    id_ok = arrow_text if str_ids else arrow_integer
    for name in ("u", "v"):
        if name in names and not id_ok(table.schema.field(name).type) and not pa.types.is_null(table.schema.field(name).type):
            raise BadRecord(f"Arrow record: column {name!r} is {table.schema.field(name).type}, "
                            f"expected {'string' if str_ids else 'integer'} vertex ids")
    if not arrow_text(table.schema.field("op").type):
        raise BadRecord(f"Arrow record: column 'op' is {table.schema.field('op').type}, expected string")
    if "label" in names and not (arrow_integer(table.schema.field("label").type) or
                                 arrow_text(table.schema.field("label").type)):
        raise BadRecord(f"Arrow record: column 'label' is {table.schema.field('label').type}, expected integer "
                        f"(or string: label names)")
    ts = table.column("ts") if "ts" in names else None
    if ts is not None and pa.types.is_timestamp(ts.type):  # event times: its unit since the epoch
        ts = ts.cast(pa.int64())
    if ts is not None and not (arrow_integer(ts.type) or pa.types.is_null(ts.type)):
        raise BadRecord(f"Arrow record: column 'ts' is {ts.type}, expected integers or timestamps (event time)")
    cols = {name: table.column(name).to_pylist() for name in ("op", "u", "v", "label") if name in names}
    if ts is not None:
        cols["ts"] = ts.to_pylist()
    none = [None] * table.num_rows
    base = carry.record(rec.key, rec.headers)
    carried = [f for f in carry.fields if f in names]
    values = [dict(zip(carried, row)) for row in zip(*(table.column(f).to_pylist() for f in carried))] \
        if carried else repeat({}, table.num_rows)
    return [_update(rec, i, f"row {i}", op, u, v, label, str_ids, max_id_bytes, carry.update(base, fields), labels,
                    ts, event_time)
            for i, (op, u, v, label, ts, fields) in enumerate(zip(cols["op"], cols["u"], cols.get("v", none),
                                                                  cols.get("label", none), cols.get("ts", none),
                                                                  values))]


_DECODERS = {"arrow": _arrow, "json": _json, "text": _text}
