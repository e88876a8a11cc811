"""Readers and writers for graphs, queries and update streams.

Text formats (both accept `#` comments and blank lines):
  * `t N M` header, `v id label degree`, `e u v [elabel]`  (SubgraphMatching, EGSM, gMatch)
  * `v id label`, `e u v [elabel]`                         (RapidFlow, the CSM benchmark)
Update streams: `e u v [elabel]`, `-e u v [elabel]`, `v id label`, `-v id`.
Tables: Arrow IPC (file or stream) or Parquet edge tables with columns
`src`, `dst` and optional `label`; vertex labels come from a sibling table
`<stem>.vertices<suffix>` with columns `id`, `label` (all 0 when it is absent).

Where a label is read in text, a name stands for it (labels.py: `labels`).

Every malformed input raises InputError(file, line, reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from csmd.errors import InputError, missing
from csmd.model.direction import MAX_DIRECTED_LABEL
from csmd.model.graph import Graph, id_array, scalar
from csmd.model.labels import NO_NAMES, LabelNames, unknown_label
from csmd.model.time_constraints import query_time

try:
    from csmd.model.graph_scan import scan_graph
except ImportError:  # no numba: the line parser reads every file
    scan_graph = None

MAX_QUERY_VERTICES = 32
TABLE_SUFFIXES = (".arrow", ".ipc", ".feather", ".parquet")
# the longest string vertex id, in UTF-8 bytes ([graph] max_id_bytes, --max-id-bytes): every match,
# delta and checkpoint row holds its ids, and one id of 100,000 characters made 100 inserts take 46 s
MAX_ID_BYTES = 256
ID_KINDS = ("auto", "int", "string")  # [graph] ids, --ids: auto takes the initial graph's (int without one)


_DECIMAL = re.compile(r"[-+]?[0-9]+")  # ASCII: Python's int() also takes 1_0 and other scripts' digits


def _int(tok: str, path, lineno, what: str) -> int:
    try:
        if _DECIMAL.fullmatch(tok):
            return int(tok)
    except ValueError:  # past Python's digit limit
        pass
    raise InputError(path, lineno, f"bad integer {tok!r} for {what}")


def in_int64(x: int) -> bool:
    """Whether an integer vertex id fits the int64 the graph, deltas and checkpoints store it as."""
    return -2**63 <= x < 2**63


def id_problem(x: str, max_bytes: int) -> str | None:
    """Why a string vertex id is refused (None: it is not): an empty one names nothing, and a long
    one weighs on every match that holds it."""
    if not x:
        return "empty vertex id"
    shown = f"{x[:40]!r}{'...' if len(x) > 40 else ''}"
    try:
        size = len(x) if x.isascii() else len(x.encode("utf-8"))  # isascii() costs nothing
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800"): no Arrow output could hold it
        return f"vertex id {shown} is not valid Unicode (a lone surrogate)"
    if size > max_bytes:
        return f"vertex id {shown} is {size} bytes long (UTF-8), longer than max_id_bytes ({max_bytes})"
    return None


def _ts(tok: str, path, lineno) -> int:
    val = _int(tok, path, lineno, "ts")
    if not in_int64(val):
        raise InputError(path, lineno, f"ts {val} out of range (int64: -2^63 .. 2^63-1)")
    return val


def _vertex_id(tok: str, path, lineno) -> int:
    val = _int(tok, path, lineno, "vertex id")
    if not in_int64(val):
        raise InputError(path, lineno, f"vertex id {val} out of range (int64: -2^63 .. 2^63-1)")
    return val


def _label(tok: str, path, lineno, what: str, names: dict) -> int:
    """A label: a number, or one of `names` (LabelNames.vertex or .edge)."""
    if tok in names:
        return names[tok]
    if names and not _DECIMAL.fullmatch(tok):
        raise InputError(path, lineno, unknown_label(tok, names, what))
    val = _int(tok, path, lineno, what)
    if val < 0 or val >= 2**31:
        raise InputError(path, lineno, f"{what} {val} out of range (0 .. 2^31-1)")
    return val


def _lines(path: Path):
    """(line number, text) of a text file; undecodable bytes become U+FFFD and fail parsing."""
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, None, exc.strerror or str(exc)) from None
    with f:
        yield from enumerate(f, 1)


def _repeats(src, dst, els, directed: bool = False) -> tuple[tuple[int, int] | None, int]:
    """(an edge, a later one of the same pair with another label), as positions, or None; and
    undirected, how many pairs are listed both ways. A pair has at most one edge (directed: one
    arc each way): which label a data graph keeps, or which a query asks for, would be anyone's
    guess (repeats with the same label are harmless, and dropped; so are self-loops)."""
    lo, hi = (src, dst) if directed else (np.minimum(src, dst), np.maximum(src, dst))
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    order = np.argsort(lo * (int(hi.max(initial=0)) + 1) + hi, kind="stable")  # by pair, then position (ids >= 0)
    el = np.where(src == dst, -1, els)[order]  # self-loops are dropped whatever their labels
    lo, hi = lo[order], hi[order]
    new = np.ones(len(lo), bool)
    new[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    head = np.maximum.accumulate(np.where(new, np.arange(len(lo)), 0))  # where each one's pair starts
    fwd = (src < dst)[order]
    both = 0 if directed else len(np.unique(head[(fwd != fwd[head]) & (el >= 0)]))
    again = np.flatnonzero(el != el[head])
    if not len(again):
        return None, both
    i = again[np.argmin(order[again])]
    return (int(order[head[i]]), int(order[i])), both


# ---- text graphs -----------------------------------------------------------------
def _read_text_graph(path: Path, lines=None, query: bool = False, names: LabelNames = NO_NAMES,
                     directed: bool = False) -> Graph:
    """A graph in either text format; `lines` ((number, text) pairs) replace reading `path`. A
    query's self-loop is refused: a data graph has none, and dropping it would match more.
    `names`: the names that may stand for labels. directed: `e u v` is the arc u -> v. A data
    graph file that is plain (graph_scan.py) is read by the compiled scanner."""
    if lines is None and not query and not names.vertex and not names.edge and scan_graph is not None:
        scanned = scan_graph(path)
        if scanned is not None:
            return _text_graph(path, *scanned, query=False, directed=directed)
    ids: dict[int, int] = {}
    labels: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    els: list[int] = []
    edge_lines: list[int] = []
    timed: list[tuple[int, int, int]] = []  # (u, v, ts) of the edges given an event time
    span, order = None, []  # a query's time constraints (model/time_constraints.py)
    header = None
    for lineno, line in _lines(path) if lines is None else lines:
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        tag = parts[0]
        if tag == "v":
            if len(parts) == 2:
                raise InputError(path, lineno, f"vertex {parts[1]}: label missing")
            if len(parts) not in (3, 4):
                raise InputError(path, lineno, f"wrong field count: 'v' takes id label [degree], got {len(parts) - 1} fields")
            vid = _vertex_id(parts[1], path, lineno)
            if vid in ids:
                raise InputError(path, lineno, f"duplicate vertex id {vid}")
            ids[vid] = len(labels)
            labels.append(_label(parts[2], path, lineno, "vertex label", names.vertex))
            if len(parts) == 4:
                _int(parts[3], path, lineno, "degree")
        elif tag == "e":
            if len(parts) not in (3, 4, 5) or (query and len(parts) == 5):
                raise InputError(path, lineno, f"wrong field count: 'e' takes u v [label{'' if query else ' [ts]'}], "
                                               f"got {len(parts) - 1} fields")
            u = _vertex_id(parts[1], path, lineno)
            v = _vertex_id(parts[2], path, lineno)
            for x in (u, v):
                if x not in ids:
                    raise InputError(path, lineno, f"edge ({u}, {v}) names unknown vertex {x}")
            if query and u == v:
                raise InputError(path, lineno, f"query edge ({u}, {v}) is a self-loop: no data edge matches it")
            src.append(ids[u])
            dst.append(ids[v])
            els.append(_label(parts[3], path, lineno, "edge label", names.edge) if len(parts) >= 4 else 0)
            edge_lines.append(lineno)
            if len(parts) == 5:
                timed.append((u, v, _ts(parts[4], path, lineno)))
        elif tag in ("w", "o") and query and not names.timed:
            raise InputError(path, lineno, f"'{tag}' (a time constraint) needs event time: [graph] time = \"event\" "
                                           f"(csmd replay --time event; csmd match: a graph whose edges have a ts)")
        elif tag == "w" and query:
            if len(parts) != 2:
                raise InputError(path, lineno, f"wrong field count: 'w' takes SPAN, got {len(parts) - 1} fields")
            if span is not None:
                raise InputError(path, lineno, "a second 'w' line: a query has one span")
            span = _ts(parts[1], path, lineno)
            if span < 0:
                raise InputError(path, lineno, f"span {span}: must be >= 0 (the largest ts less the smallest)")
        elif tag == "o" and query:
            if len(parts) != 3:
                raise InputError(path, lineno, f"wrong field count: 'o' takes i j (edge i before edge j), got "
                                               f"{len(parts) - 1} fields")
            order.append((_int(parts[1], path, lineno, "edge number"), _int(parts[2], path, lineno, "edge number"),
                          lineno))
        elif tag == "t":
            if header is not None or labels or src:
                raise InputError(path, lineno, "'t' header must be the first record")
            if len(parts) != 3:
                raise InputError(path, lineno, f"wrong field count: 't' takes N M, got {len(parts) - 1} fields")
            header = (lineno, _int(parts[1], path, lineno, "N"), _int(parts[2], path, lineno, "M"))
        else:
            raise InputError(path, lineno, f"unknown record type {tag!r} (expected t, v or e{', w or o' if query else ''})")
    if not labels:
        raise InputError(path, None, "no vertices")
    if header is not None:
        lineno, n, m = header
        if n != len(labels) or m != len(src):
            raise InputError(path, lineno, f"header says {n} vertices and {m} edges, file has {len(labels)} and {len(src)}")
    g = _text_graph(path, np.fromiter(ids.keys(), np.int64, len(ids)), labels, src, dst, els, edge_lines,
                    tuple(np.array(c, np.int64) for c in zip(*timed)) if timed else None, query, directed)
    g.time = query_time(list(zip(src, dst)), span, order, directed, path)
    return g


def _text_graph(path, ext, labels, src, dst, els, edge_lines, timed, query: bool, directed: bool) -> Graph:
    """The graph of a text file's vertices (ext ids, labels) and edges (internal ends, labels, line
    numbers; timed: the (u, v, ts) columns of those with a ts, ext ids, or None), checked."""
    s, d = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    twice, both = _repeats(s, d, els, directed)
    if twice is not None:
        a, b = twice
        raise InputError(path, edge_lines[b], f"edge ({ext[src[b]]}, {ext[dst[b]]}) again, with label {els[b]} (line "
                                              f"{edge_lines[a]} gave it {els[a]}): "
                                              f"{'an arc u -> v is one edge' if directed else 'a pair has at most one edge'}")
    _check_direction(path, ext[s], ext[d], np.array(els, np.int64), edge_lines.__getitem__, query, directed)
    if not query:
        _warn_both_ways(path, both)
    ext_ids = None if np.array_equal(ext, np.arange(len(ext))) else ext
    g = Graph.from_edges(labels, s, d, els, ext_ids, directed)
    if timed is not None:
        g.edge_ts = timed
    return g


def _check_direction(path, src, dst, els, where, query: bool, directed: bool) -> None:
    """Refuse what would silently change meaning with the graph's direction: a directed edge label
    past what a directed graph holds; in an undirected query, both (a, b) and (b, a), which read
    as one edge (a query that needs both arcs needs --directed). src, dst: the ends' ids; where: the
    line (or row) of edge i is where(i)."""
    if directed:
        big = np.flatnonzero(els > MAX_DIRECTED_LABEL)
        if len(big):
            raise InputError(path, where(big[0]), f"edge label {els[big[0]]}: a directed graph's edge labels are 0 .. "
                                                  f"{MAX_DIRECTED_LABEL}")
        return
    if not query or not len(src):
        return
    fwd = set(zip(src.tolist(), dst.tolist()))
    for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
        if (b, a) in fwd and a != b:
            raise InputError(path, where(i), f"query edges ({a}, {b}) and ({b}, {a}): an undirected query has one edge "
                                             f"per pair; a query whose arcs go both ways needs a directed graph "
                                             f"(--directed, [graph] directed = true)")


def _warn_both_ways(path, both: int) -> None:
    """A data graph read as undirected that lists `both` pairs both ways (a directed graph,
    probably): each such pair becomes one edge, so say so (a warning: undirected datasets often
    list both)."""
    if both:
        from csmd.logs import get_logger

        get_logger().warning("the graph lists vertex pairs both ways; read as undirected, each pair is one edge "
                             "(--directed, [graph] directed = true, reads its lines as arcs)", path=str(path),
                             pairs=both)


# ---- tables ------------------------------------------------------------------------
def _read_table(path: Path):
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        try:
            return ipc.open_file(path).read_all()
        except pa.ArrowInvalid:
            return ipc.open_stream(path).read_all()
    except OSError as exc:
        raise InputError(path, None, str(exc)) from None
    except pa.ArrowInvalid as exc:
        raise InputError(path, None, f"not a readable Arrow/Parquet table: {exc}") from None


def _column(table, name, path, required=True):
    if name not in table.column_names:
        if required:
            raise InputError(path, None, f"missing column {name!r} (has {', '.join(table.column_names)})")
        return None
    col = table.column(name)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(path, f"row {row}", f"null in column {name!r}")
    return col.to_numpy(zero_copy_only=False)


def arrow_text(typ: pa.DataType) -> bool:
    """Whether an Arrow column holds strings: string, large_string, string_view (what Polars writes)
    or a dictionary of one of them."""
    typ = typ.value_type if pa.types.is_dictionary(typ) else typ
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def arrow_integer(typ: pa.DataType) -> bool:
    """Whether an Arrow column holds integers, plain or through a dictionary."""
    return pa.types.is_integer(typ.value_type if pa.types.is_dictionary(typ) else typ)


def _ids(table, name, path, max_bytes: int = MAX_ID_BYTES) -> np.ndarray:
    """The vertex ids of column `name`: int64 from any integer column, objects from a string one
    (any of arrow_text's kinds). Other types (floats, bools, lists, timestamps) are refused rather
    than read as ids, and so are a uint64 beyond int64 (the daemon and the outputs hold ids as int64
    or strings), an empty string and one over max_bytes (id_problem)."""
    if name in table.column_names:
        typ = table.schema.field(name).type
        if not (arrow_text(typ) or arrow_integer(typ)):
            raise InputError(path, None, f"column {name!r} is {typ}; vertex ids are integers or strings")
        plain = pa.string() if arrow_text(typ) else typ.value_type if pa.types.is_dictionary(typ) else typ
        if plain != typ:
            table = table.set_column(table.column_names.index(name), name, table.column(name).cast(plain))
    values = _column(table, name, path)
    if values.dtype == np.uint64 and len(values) and values.max() > np.iinfo(np.int64).max:
        row = int(np.flatnonzero(values > np.iinfo(np.int64).max)[0])
        raise InputError(path, f"row {row}", f"vertex id {scalar(values[row])} in {name} out of range "
                                             f"(int64: -2^63 .. 2^63-1)")
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    size = pc.binary_length(table.column(name)).to_numpy()  # UTF-8 bytes, without a Python step per id
    bad = np.flatnonzero((size == 0) | (size > max_bytes))
    if len(bad):
        raise InputError(path, f"row {bad[0]}", f"column {name!r}: {id_problem(values[bad[0]], max_bytes)}")
    return id_array(values, True)


def _ints(values, path, name):
    if values.dtype.kind not in "iu":
        raise InputError(path, None, f"column {name!r} must be integers, is {values.dtype}")
    if len(values) and (values.min() < 0 or values.max() >= 2**31):
        row = int(np.flatnonzero((values < 0) | (values >= 2**31))[0])
        raise InputError(path, f"row {row}", f"{name} {scalar(values[row])} out of range (0 .. 2^31-1)")
    return values.astype(np.int32)


def _kind(ids: np.ndarray) -> str:
    return "integer" if ids.dtype.kind in "iu" else "string"


def vertices_path(path: Path) -> Path:
    """Where the vertex table of edge table `path` lives."""
    return path.with_name(path.stem + ".vertices" + path.suffix)


def table_edge_ts(table, src: np.ndarray, dst: np.ndarray, where) -> tuple | None:
    """Graph.edge_ts of an edge table whose rows are the edges (src[i], dst[i]) (external ids):
    from its `ts` column of integers or timestamps (their unit since the epoch), null for an edge
    without one; None where it has none. A column of another type is not event times: it is left
    alone, with a warning (a table read without event time must not fail on it)."""
    if "ts" not in table.column_names:
        return None
    col = table.column("ts")
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    elif not (arrow_integer(col.type) or pa.types.is_null(col.type)):
        from csmd.logs import get_logger

        get_logger().warning("column ts is not read as event times (integers or timestamps are)", path=str(where),
                             type=str(col.type))
        return None
    given = ~col.is_null().to_numpy(zero_copy_only=False)
    ts = col.to_numpy(zero_copy_only=False)[given]
    if ts.dtype == np.uint64 and len(ts) and ts.max() > np.iinfo(np.int64).max:
        raise InputError(where, None, "column 'ts' holds a value past int64")
    return src[given], dst[given], ts.astype(np.int64)


def _read_table_graph(path: Path, max_id_bytes: int = MAX_ID_BYTES, directed: bool = False) -> Graph:
    """An edge table (and its vertex table); one with no rows is an empty graph of its columns' id kind."""
    edges = _read_table(path)
    src, dst = _ids(edges, "src", path, max_id_bytes), _ids(edges, "dst", path, max_id_bytes)
    if src.dtype != dst.dtype:
        raise InputError(path, None, f"column 'src' holds {_kind(src)} ids, 'dst' {_kind(dst)} ones: "
                                     "a graph's vertex ids are all integers or all strings")
    el = _column(edges, "label", path, required=False)
    el = np.zeros(len(src), np.int32) if el is None else _ints(el, path, "label")
    vpath = vertices_path(path)
    if vpath.exists():
        verts = _read_table(vpath)
        ext = _ids(verts, "id", vpath, max_id_bytes)
        if len(src) and ext.dtype != src.dtype:
            raise InputError(vpath, None, f"column 'id' holds {_kind(ext)} ids, the edges of {path.name} "
                                          f"{_kind(src)} ones")
        labels = _ints(_column(verts, "label", vpath), vpath, "label")
        uniq, first = np.unique(ext, return_index=True)
        if len(uniq) != len(ext):
            dup = np.setdiff1d(np.arange(len(ext)), first)[0]
            raise InputError(vpath, f"row {dup}", f"duplicate vertex id {scalar(ext[dup])}")
    else:
        ext = np.unique(np.concatenate([src, dst]))
        labels = np.zeros(len(ext), np.int32)
    # map external ids to dense ids through the sorted unique ids
    order = np.argsort(ext, kind="stable")
    sorted_ext = ext[order]
    internal = []
    for name, col in (("src", src), ("dst", dst)):
        pos = np.minimum(np.searchsorted(sorted_ext, col), max(len(ext) - 1, 0))
        bad = np.flatnonzero(sorted_ext[pos] != col) if len(ext) else np.arange(len(col))
        if len(bad):
            raise InputError(path, f"row {bad[0]}", f"edge names unknown vertex {scalar(col[bad[0]])!r} in {name}")
        internal.append(order[pos])
    twice, both = _repeats(internal[0], internal[1], el, directed)
    if twice is not None:
        a, b = twice
        raise InputError(path, f"row {b}", f"edge ({scalar(src[b])!r}, {scalar(dst[b])!r}) again, with label {el[b]} "
                                           f"(row {a} gave it {el[a]}): "
                                           f"{'an arc u -> v is one edge' if directed else 'a pair has at most one edge'}")
    _check_direction(path, src, dst, el, "row {}".format, False, directed)
    _warn_both_ways(path, both)
    ext_ids = None if ext.dtype.kind in "iu" and np.array_equal(ext, np.arange(len(ext))) else ext
    g = Graph.from_edges(labels, internal[0], internal[1], el, ext_ids, directed)
    g.edge_ts = table_edge_ts(edges, src, dst, path)
    return g


def write_graph_tables(graph: Graph, path) -> None:
    """Write `graph` as an edge table at `path` (.parquet or Arrow IPC) plus its vertex table."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    path = Path(path)
    s, d, e = graph.arcs()
    ext = graph.ext_ids
    edges = pa.table({"src": ext[s], "dst": ext[d], "label": e})
    verts = pa.table({"id": ext, "label": graph.labels})
    for table, p in ((edges, path), (verts, vertices_path(path))):
        if p.suffix == ".parquet":
            pq.write_table(table, p)
        else:
            with ipc.new_file(p, table.schema) as w:
                w.write_table(table)


# ---- public entry points -------------------------------------------------------------
def read_graph(path, max_id_bytes: int = MAX_ID_BYTES, labels: LabelNames = NO_NAMES, directed: bool = False) -> Graph:
    """Load a data graph from any supported format (chosen by the file suffix); string ids over
    max_id_bytes (UTF-8) are refused; in text, `labels`' names may stand for labels (tables hold
    numbers). directed: an edge u v (a table's src, dst) is the arc u -> v."""
    path, directed = Path(path), directed or labels.directed
    if path.suffix in TABLE_SUFFIXES:
        return _read_table_graph(path, max_id_bytes, directed)
    return _read_text_graph(path, names=labels, directed=directed)


def initial_graph(path, ids: str = "auto", max_id_bytes: int = MAX_ID_BYTES, setting: str = "--ids",
                  labels: LabelNames = NO_NAMES, directed: bool = False) -> Graph:
    """The graph a stream starts from: the file at `path`, or with none an empty graph whose ids
    are of the kind `ids` says (int for auto): a deployment keyed by strings can start empty. An
    `ids` that the file's ids contradict is an error naming both (`setting` names the option)."""
    if not path:
        return Graph.from_edges(np.zeros(0, np.int32), [], [], ext_ids=id_array([], ids == "string"),
                                directed=directed or labels.directed)
    g = read_graph(path, max_id_bytes, labels, directed)
    conflict = id_kind_conflict(g, ids, setting)
    if conflict:
        raise InputError(path, None, conflict)
    return g


def id_kind_conflict(g: Graph, ids: str, setting: str) -> str | None:
    """Why `ids` (int, string or auto), as `setting` gave it, is not the kind of g's ids; None if it is."""
    if ids in ("auto", "string" if g.str_ids else "int"):
        return None
    return f"{setting} is {ids!r}, but the graph's vertex ids are {'strings' if g.str_ids else 'integers'}"


def read_query(path, labels: LabelNames = NO_NAMES, directed: bool = False) -> Graph:
    """Load a query graph and refuse what no engine accepts (too large, disconnected, self-loops).
    directed (or labels.directed): for a directed data graph (its edges are arcs)."""
    path, directed = Path(path), directed or labels.directed
    return _checked_query(read_graph(path, directed=directed) if path.suffix in TABLE_SUFFIXES else
                          _read_text_graph(path, query=True, names=labels, directed=directed), path)


def parse_query_text(text: str, name: str, labels: LabelNames = NO_NAMES, directed: bool = False) -> Graph:
    """A query graph sent as text (control messages, `csmd admin`); errors name `name` and the line."""
    return _checked_query(_read_text_graph(name, enumerate(text.splitlines(), 1), query=True, names=labels,
                                           directed=directed or labels.directed), name)


def _checked_query(q: Graph, path) -> Graph:
    if q.n > MAX_QUERY_VERTICES:
        raise InputError(path, None, f"query has {q.n} vertices; at most {MAX_QUERY_VERTICES} are supported")
    seen = np.zeros(q.n, bool)
    stack = [0]
    seen[0] = True
    while stack:
        for w in q.neighbors(stack.pop()):
            if not seen[w]:
                seen[w] = True
                stack.append(int(w))
    if not seen.all():
        lost = scalar(q.ext_ids[np.flatnonzero(~seen)[0]])
        raise InputError(path, None, f"query is disconnected (vertex {lost} is not reachable from vertex {scalar(q.ext_ids[0])})")
    return q


def query_files(paths) -> list[Path]:
    """Expand directories into their query files (sorted naturally: Q_2 before Q_10)."""

    def natural(p: Path):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = [f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")]
            if not files:
                raise InputError(p, None, "directory holds no query files")
            out.extend(sorted(files, key=natural))
        elif p.exists():
            out.append(p)
        else:
            raise missing(p)
    return out


# ---- update streams --------------------------------------------------------------------
INSERT_EDGE, DELETE_EDGE, INSERT_VERTEX, DELETE_VERTEX = "e", "-e", "v", "-v"
_UPDATE_FIELDS = {INSERT_EDGE: (2, 4), DELETE_EDGE: (2, 4), INSERT_VERTEX: (2, 2), DELETE_VERTEX: (1, 1)}
_UPDATE_USAGE = {INSERT_EDGE: "u v [label [ts]]", DELETE_EDGE: "u v [label [ts]]", INSERT_VERTEX: "id label",
                 DELETE_VERTEX: "id"}
EDGE_OPS = (INSERT_EDGE, DELETE_EDGE)
TS_NEEDED = 'event time ([graph] time = "event", --time event) needs a ts on every edge update'


def ts_problem(ts) -> str | None:
    """Why an update's ts is refused (None: it is not): an event time is an int64."""
    if type(ts) is not int or not in_int64(ts):  # bool is an int subclass: refused too
        return f"ts {ts!r} is not an integer in int64 range"
    return None


@dataclass(frozen=True, slots=True)
class Update:
    """One update record. `u`, `v` are external ids (v unused for vertex ops);
    `label` is the edge label or the new vertex's label; `source` says where it came
    from, for people; `origin` is (input, partition, offset) of its input record, the
    first half of the id of every delta it causes."""

    op: str
    u: int
    v: int = -1
    label: int = 0
    source: str = ""
    origin: tuple = ("", 0, 0)
    # what its deltas carry of the input record (connectors.records.Carry.context): (key, headers,
    # fields), None when nothing
    context: tuple | None = None
    ts: int | None = None  # the event time of an edge update (pipeline/event_time.py), None: none given


def text_array(x: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(x, np.int64)).cast(pa.string())  # line numbers and offsets: integers


OPS = (INSERT_EDGE, DELETE_EDGE, INSERT_VERTEX, DELETE_VERTEX)  # an UpdateBlock's op codes index this


@dataclass(frozen=True)
class UpdateBlock:
    """Consecutive one-update lines of a stream file, in columns: row i is the Update that
    parse_update makes of line lineno[i] (op: an index into OPS). A reader fills it without a
    Python step per line; the pipeline cuts it into batches and sequences edge-only batches
    of it with numpy, making Update objects only where a delta needs its record. The input
    records of row i are (path, partition, lineno[i]): a subclass reads other inputs
    (connectors.records.RecordBlock: Kafka records, lineno their offsets)."""

    path: str
    lineno: np.ndarray  # int64
    op: np.ndarray  # int8
    u: np.ndarray  # int64 external ids
    v: np.ndarray  # int64; -1 for vertex ops
    label: np.ndarray  # int64
    cut_from: tuple | None = None  # (block, row): what rows() cut these rows from, and where
    partition: int = 0
    # the update's line within its record where a record holds several (0: the record's only
    # update); None: every row is its record's only update
    part: np.ndarray | None = None
    context: dict | None = None  # lineno -> the context (Update.context) of that record, where it has one

    def __len__(self) -> int:
        return len(self.lineno)

    def _prefix(self) -> str:
        """What a row's source starts with; its line number follows."""
        return f"{self.path}:"

    def source(self, i: int) -> str:
        """Where the update of row i comes from, for people."""
        return f"{self._prefix()}{self.lineno[i]}"

    def sources(self, rows: np.ndarray) -> pa.Array:
        """source(i) of each of the rows, as Arrow strings: no Python string per row (a batch's
        deltas name thousands of updates)."""
        return pc.binary_join_element_wise(self._prefix(), text_array(self.lineno[rows]), "")

    def update(self, i: int) -> Update:
        at = int(self.lineno[i])
        return Update(OPS[self.op[i]], int(self.u[i]), int(self.v[i]), int(self.label[i]), self.source(i),
                      (self.path, self.partition, at), self.context.get(at) if self.context else None)

    def updates(self) -> list[Update]:
        return [self.update(i) for i in range(len(self))]

    def rows(self, lo: int, hi: int) -> "UpdateBlock":
        root, at = self.cut_from or (self, 0)
        # its fields copied, not dataclasses.replace: a batch of one update is cut per record, and
        # replace (__init__ over every field) cost 2.3 us of that on the VM, this 1.2
        cut = object.__new__(type(self))
        cut.__dict__.update(self.__dict__, lineno=self.lineno[lo:hi], op=self.op[lo:hi], u=self.u[lo:hi],
                            v=self.v[lo:hi], label=self.label[lo:hi],
                            part=None if self.part is None else self.part[lo:hi], cut_from=(root, at + lo))
        return cut

    @staticmethod
    def concat(blocks: list["UpdateBlock"]) -> "UpdateBlock":
        """Blocks of one file (or input partition), in order."""
        if len(blocks) == 1:
            return blocks[0]
        part = None if all(b.part is None for b in blocks) else \
            np.concatenate([np.zeros(len(b), np.int64) if b.part is None else b.part for b in blocks])
        context = {at: c for b in blocks if b.context for at, c in b.context.items()} or None
        return replace(blocks[0], cut_from=None, part=part, context=context,
                       **{f: np.concatenate([getattr(b, f) for b in blocks])
                          for f in ("lineno", "op", "u", "v", "label")})


def parse_update(line: str, path, lineno, source: str | None = None, origin: tuple | None = None,
                 str_ids: bool = False, max_id_bytes: int = MAX_ID_BYTES,
                 labels: LabelNames = NO_NAMES, event_time: bool = False) -> Update | None:
    """Parse one stream line; None for blanks and comments. source / origin replace the
    defaults (path:lineno, (path, 0, lineno)) where the line is part of a larger record.
    str_ids: the vertex ids are the tokens as written (a graph keyed by strings; at most
    max_id_bytes each), else int64. labels: the names that may stand for labels. An edge line's
    ts may follow its label (`e u v label ts`); event_time: every edge line must have one."""
    parts = line.split()
    if not parts or parts[0][0] == "#":
        return None
    op = parts[0]
    shape = _UPDATE_FIELDS.get(op)
    if shape is None:
        raise InputError(path, lineno, f"unknown op {op!r} (expected e, -e, v or -v)")
    nf = len(parts) - 1
    if not shape[0] <= nf <= shape[1]:
        raise InputError(path, lineno, f"wrong field count: {op!r} takes {_UPDATE_USAGE[op]}, got {nf} fields")
    if source is None:
        source, origin = f"{path}:{lineno}", (str(path), 0, lineno)

    def vertex(tok: str):
        if not str_ids:
            return _vertex_id(tok, path, lineno)
        problem = id_problem(tok, max_id_bytes)
        if problem:
            raise InputError(path, lineno, problem)
        return tok

    u = vertex(parts[1])
    if op == INSERT_VERTEX:
        return Update(op, u, -1, _label(parts[2], path, lineno, "vertex label", labels.vertex), source, origin)
    if op == DELETE_VERTEX:
        return Update(op, u, -1, 0, source, origin)
    v = vertex(parts[2])
    ts = None
    if nf == 4:
        ts = _ts(parts[4], path, lineno)
    elif event_time:
        raise InputError(path, lineno, f"no ts: {TS_NEEDED} (e u v label ts)")
    return Update(op, u, v, _label(parts[3], path, lineno, "edge label", labels.edge) if nf >= 3 else 0, source,
                  origin, ts=ts)


def read_updates(path):
    """Yield the updates of a stream file in order (lazily: streams may be long)."""
    path = Path(path)
    for lineno, line in _lines(path):
        upd = parse_update(line, path, lineno)
        if upd is not None:
            yield upd
