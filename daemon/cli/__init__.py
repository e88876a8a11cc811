"""The `csmd` command line."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from csmd import STARTED
from csmd.backends import BACKENDS, gpu_devices, resolve_backend
from csmd.errors import CsmdError, InputError, missing
from csmd.jobs import COUNT_ONLY_REPLAY_BATCH
from csmd.model.formats import ID_KINDS, MAX_ID_BYTES
from csmd.pipeline.stages import DEFAULT_BATCH_SIZE

ADD_ESTIMATE_SECONDS = 2.0  # `admin add --estimate`: an indication, not a measurement to wait for
NOTE_AFTER_SECONDS = 5.0  # `admin match`: a wait this long gets a line saying why it may last


def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None


def _positive_int(text: str) -> int:
    val = _number(int, text)
    if val < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return val


def _gpus(text: str) -> int | str:
    if text == "all":
        return text
    val = _number(int, text)
    if val < 1:
        raise argparse.ArgumentTypeError("must be a number of GPUs (1 or more) or all")
    return val


def _gpus_option(p: argparse.ArgumentParser, each: str) -> None:
    p.add_argument("--gpus", type=_gpus, default=1,
                   help=f"the GPU engine's devices: the first N, or all (default 1); each {each}")


def _batch_size(text: str) -> int:
    val = _number(int, text)
    if val < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return val


def _ts_span(text: str) -> int:
    """A window or lateness: a span of event time, in the int64 the ts are."""
    val = _number(int, text)
    if not 0 <= val < 2**63:
        raise argparse.ArgumentTypeError("must be >= 0 and below 2^63")
    return val


def _event_time(text: str) -> int:
    """A point in event time: an int64, in the unit of the graph's ts."""
    val = _number(int, text)
    if not -2**63 < val < 2**63:  # -2^63 is model/time_constraints.py NO_TS, no edge's ts
        raise argparse.ArgumentTypeError("must be an int64 (above -2^63)")
    return val


def _positive_float(text: str) -> float:
    val = _number(float, text)
    if not val > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return val


def _check_output(path: Path | None) -> None:
    """Refuse an --output that cannot be written, before any work."""
    from csmd.model.arrow_writer import STDOUT

    if path is None or path == STDOUT:
        return
    if path.is_dir():
        raise InputError(path, None, "is a directory (--output names the Arrow file to write)")
    if not path.parent.is_dir():
        raise missing(path.parent)


def _report_stream(output: Path | None):
    """Where the table (or JSON) goes: standard error when the Arrow output takes standard output."""
    from csmd.model.arrow_writer import STDOUT

    return sys.stderr if output == STDOUT else sys.stdout


def _labels(args):
    """How graph text is read: the label names of --labels (none without it), and --directed."""
    from csmd.model.labels import NO_NAMES, LabelNames

    return replace(LabelNames.load(args.labels) if args.labels else NO_NAMES, directed=args.directed)


def _labels_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", type=Path, help="TOML file of label names (tables labels and edge_labels, as in "
                                               "[graph]): graph, query and stream files may use them for labels")
    p.add_argument("--directed", action="store_true", help="the graph is directed: `e u v` is the arc u -> v, in the "
                                                           "graph, the queries and the stream ([graph] directed)")


def cmd_match(args) -> int:
    from csmd.model.arrow_writer import MatchFile
    from csmd.jobs.match import run_queries
    from csmd.jobs.progress import Progress
    from csmd.model.at_time import graph_at, has_event_time
    from csmd.model.formats import initial_graph, query_files, read_query

    if args.window is not None and args.at is None:
        raise CsmdError("--window needs --at (the event time the window ends at)")
    backend = resolve_backend(args.backend)
    gpu_devices(backend, args.gpus)  # a clear error before any reading
    _check_output(args.output)
    labels = _labels(args)
    g = initial_graph(args.data, args.ids, args.max_id_bytes, labels=labels)
    labels = replace(labels, timed=has_event_time(g))  # a query's w and o lines need edges with a ts
    if args.at is not None:
        g = graph_at(g, args.at, args.window, args.data)
    paths = query_files(args.query)
    queries = [(p, read_query(p, labels)) for p in paths]  # refuse bad queries before any work
    writer = MatchFile(args.output, g.ext_ids) if args.output else None
    out = _report_stream(args.output)
    progress = Progress(len(queries), "queries", enabled=None if len(queries) > 1 else False)
    if not args.json:
        print(f"{'query':<32} {'matches':>20} {'complete':>9} {'seconds':>10}", file=out)
    total = 0
    try:
        for res in run_queries(g, [(p.stem, q) for p, q in queries], backend=backend, distinct=args.distinct,
                               limit=args.limit, time_limit=args.time_limit, writer=writer, gpus=args.gpus):
            total += res["matches"]
            progress.step(note=res["query"])
            if args.at is not None:
                res.update(at=args.at, window=args.window)
            if args.json:
                print(json.dumps(res), file=out, flush=True)
            else:
                print(f"{res['query']:<32} {res['matches']:>20} {str(res['complete']).lower():>9} "
                      f"{res['seconds']:>10.4f}", file=out, flush=True)
    finally:
        progress.close()
        if writer is not None:
            writer.close()
    if not args.json and len(queries) > 1:
        print(f"{'total':<32} {total:>20}", file=out)
    return 0


def cmd_estimate(args) -> int:
    from csmd.backends import sampler_backend
    from csmd.jobs.estimate import run_estimate
    from csmd.model.formats import query_files, read_graph, read_query

    if args.directed and args.backend == "gpu":
        raise CsmdError("--backend gpu: the GPU sampler does not estimate directed graphs yet; use --backend cpu or auto")
    backend = sampler_backend(args.backend, args.directed)
    labels = _labels(args)
    g = read_graph(args.data, args.max_id_bytes, labels)
    queries = [(p.stem, read_query(p, labels)) for p in query_files(args.query)]  # refuse bad queries before any work
    if not args.json:
        print(f"{'query':<32} {'estimate':>14} {'95% interval':>31} {'samples':>10} {'valid':>10} {'method':>6} "
              f"{'seconds':>8}")
    for name, q in queries:
        res = run_estimate(g, q, name, method=args.method, samples=args.samples, rel_error=args.rel_error,
                           time_limit=args.time_limit, seed=args.seed, trawl=args.trawl, backend=backend)
        if args.json:
            print(json.dumps(res), flush=True)
        else:
            print(f"{name:<32} {_estimate_text(res):>14} {_interval_text(res):>31} {res['samples']:>10} "
                  f"{res['valid_samples']:>10} {res['method']:>6} {res['seconds']:>8.3f}", flush=True)
    return 0


def _estimate_text(res: dict) -> str:
    if res["estimate"] is None:
        return "no info"  # no valid sample: not a count of zero
    return f"{res['estimate']:.6g}" + (" (exact)" if res["exact"] else "")


def _interval_text(res: dict) -> str:
    return "-" if res["estimate"] is None else f"[{res['ci_low']:.6g}, {res['ci_high']:.6g}]"


def cmd_replay(args) -> int:
    from csmd.jobs.replay import replay
    from csmd.model.formats import initial_graph, query_files, read_query

    if args.count_only and args.output:
        raise CsmdError("--output writes the matches of each delta; it cannot be combined with --count-only")
    gpu_devices(resolve_backend(args.backend), args.gpus)  # a clear error before any reading
    _check_output(args.output)
    if not args.stream.exists():
        raise missing(args.stream)
    event_time = None
    if args.time == "none" and (args.window is not None or args.lateness is not None):
        raise CsmdError(f"--{'window' if args.window is not None else 'lateness'} needs --time event")
    if args.time == "event" or args.window is not None or args.lateness is not None:
        from csmd.pipeline.event_time import EventTime

        event_time = EventTime(args.window or None, args.lateness or 0)
    labels = replace(_labels(args), timed=event_time is not None)
    g0 = initial_graph(args.data, args.ids, args.max_id_bytes, labels=labels)
    queries = [(p.stem, read_query(p, labels)) for p in query_files(args.query)]
    batch_size = args.batch_size or (COUNT_ONLY_REPLAY_BATCH if args.count_only else DEFAULT_BATCH_SIZE)
    results, _ = replay(g0, args.stream, queries, batch_size=batch_size, count_only=args.count_only,
                        distinct=args.distinct, output=args.output, backend=args.backend,
                        max_id_bytes=args.max_id_bytes, labels=labels, started=STARTED, event_time=event_time,
                        gpus=args.gpus)
    out = _report_stream(args.output)
    if not args.json:
        print(f"{'query':<32} {'positive':>14} {'negative':>14} {'updates':>9} {'records':>9} {'ignored':>9} "
              f"{'seconds':>9}", file=out)
    for res in results:
        if args.json:
            print(json.dumps(res), file=out)
        else:
            print(f"{res['query']:<32} {res['positive']:>14} {res['negative']:>14} {res['updates']:>9} "
                  f"{res['records']:>9} {res['ignored']:>9} {res['seconds']:>9.3f}", file=out)
    if results and results[0]["updates"] and results[0]["ignored"] == results[0]["updates"]:
        print(f"csmd replay: warning: every update of {args.stream} was ignored (each inserts what the graph "
              f"already has, or deletes what it lacks): is it the data graph rather than an update stream?",
              file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    from csmd.service.config import load_config
    from csmd.logs import setup_logging
    from csmd.service.daemon import run_daemon

    cfg = load_config(args.config)
    setup_logging(cfg.log.format, cfg.log.level)
    return run_daemon(cfg)


def cmd_admin(args) -> int:
    from urllib.parse import quote

    from csmd.service.admin import call

    url = args.url
    if args.action == "add":
        body = {"name": args.name or args.query.stem, "query": _read_text(args.query), "count_only": args.count_only,
                "distinct": args.distinct}
        res = call(url, "POST", "/queries", body)
        if args.estimate:
            # after the change took effect, so the estimate is of the graph the query starts from
            est = call(url, "POST", "/estimate", {"name": body["name"], "query": body["query"],
                                                  "time_limit": ADD_ESTIMATE_SECONDS},
                       timeout=ADD_ESTIMATE_SECONDS + 30)
            res["estimate"] = {k: est[k] for k in ("estimate", "ci_low", "ci_high", "confidence", "seq")}
            if args.distinct:  # the sampler estimates embeddings; an instance is |Aut(q)| of them
                from csmd.model.formats import parse_query_text
                from csmd.model.plan import symmetry_constraints

                aut = symmetry_constraints(parse_query_text(body["query"], str(args.query)))[1]
                res["estimate"].update({k: est[k] / aut for k in ("estimate", "ci_low", "ci_high")
                                        if est[k] is not None})
    elif args.action == "remove":
        res = call(url, "DELETE", "/queries/" + quote(args.name, safe=""))
    elif args.action == "list":
        res = call(url, "GET", "/queries")
    elif args.action == "match":
        body = {"name": args.query.stem, "query": _read_text(args.query), "distinct": args.distinct,
                "limit": args.limit, "time_limit": args.time_limit}
        with _note_if_slow("the daemon is still matching; its first static search on a machine compiles the "
                           "search kernels first (numba, about 20 s, once)"):
            res = call(url, "POST", "/match", body, timeout=(args.time_limit or 3600) + 30)
    elif args.action == "estimate":
        from csmd.jobs.estimate import DEFAULT_TIME_LIMIT

        body = {"name": args.query.stem, "query": _read_text(args.query), "method": args.method,
                "samples": args.samples, "rel_error": args.rel_error, "time_limit": args.time_limit, "seed": args.seed,
                "trawl": args.trawl}
        res = call(url, "POST", "/estimate", body, timeout=(args.time_limit or DEFAULT_TIME_LIMIT) + 30)
    elif args.action == "metrics":
        print(call(url, "GET", "/metrics"), end="")
        return 0
    else:
        res = call(url, "GET", "/" + args.action)  # stats, health
    if args.json:
        print(json.dumps(res))
    elif args.action == "list":
        # a daemon before distinct queries does not say "distinct"
        kinds = [("count-only" if q["count_only"] else "matches") + (" distinct" if q.get("distinct") else "")
                 for q in res["queries"]]
        width = max([10, *map(len, kinds)])
        for kind, q in zip(kinds, res["queries"]):  # the name last: a wide (CJK) or long name cannot misalign it
            print(f"{kind:<{width}}  {q['name']}")
    else:
        from csmd.cli.live import shown  # null: nothing measured yet (an empty latency histogram), "-"

        for key, value in res.items():
            print(f"{key:<20} {json.dumps(value) if isinstance(value, (dict, list)) else shown(value, '{}')}")
    return 0


@contextmanager
def _note_if_slow(note: str):
    """Says `note` on stderr if the block still runs after NOTE_AFTER_SECONDS: a wait with no word looks hung."""
    timer = threading.Timer(NOTE_AFTER_SECONDS, lambda: print(f"csmd admin: {note} ...", file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CsmdError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None


def cmd_broker(args) -> int:
    from csmd.cli.broker import run_broker

    return run_broker(args)


def cmd_demo(args) -> int:
    from csmd.cli.demo import run_demo

    return run_demo(args)


def _id_options(p: argparse.ArgumentParser, kinds: bool = True) -> None:
    """How the data graph's (and the stream's) vertex ids are read, as the daemon's [graph] ids and max_id_bytes."""
    if kinds:
        p.add_argument("--ids", choices=ID_KINDS, default="auto",
                       help="vertex id kind: int or string; an error if the graph's ids are the other kind "
                            "(default auto: the graph's)")
    p.add_argument("--max-id-bytes", type=_batch_size, default=MAX_ID_BYTES,
                   help=f"refuse string vertex ids longer than this many UTF-8 bytes (default {MAX_ID_BYTES})")


def _estimate_options(p: argparse.ArgumentParser) -> None:
    """The sampling options that `csmd estimate` and `csmd admin estimate` share."""
    p.add_argument("--method", choices=("wj", "alley", "auto"), default="auto",
                   help="WanderJoin or Alley walks (default auto: Alley)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--samples", type=_batch_size, help="draw N samples per query (rounded up to whole blocks)")
    stop.add_argument("--rel-error", type=_positive_float,
                      help="stop once the interval's half-width / estimate is at most X (default 0.05)")
    p.add_argument("--time-limit", type=_positive_float,
                   help="stop sampling a query after S seconds (default 10 without --samples)")
    p.add_argument("--seed", type=_positive_int, default=0, help="random seed: the same seed gives the same answer")
    p.add_argument("--trawl", type=_positive_int, default=0,
                   help="count the matches of the last K query vertices exactly for each sampled prefix "
                        "(trawling; default 0: sample every vertex)")


class _Version(argparse.Action):
    """--version, reading the installed version only when asked: importlib.metadata costs every
    other command some 20 ms of start-up. Run from a source tree that was never installed
    (PYTHONPATH), there is no installed version: the package's own, marked +source."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("csmd")
        except PackageNotFoundError:
            from csmd import __version__

            text = f"{__version__}+source"
        print(f"csmd {text}")  # on stdout, as argparse's own version action prints
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="csmd", description="Streaming continuous subgraph matching.")
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("match", help="one-shot static query: count or list the matches of queries in a graph")
    m.add_argument("--data", required=True, type=Path, help="data graph (text format, .arrow or .parquet)")
    m.add_argument("--query", required=True, nargs="+", type=Path, help="query files or directories of them")
    m.add_argument("--backend", choices=BACKENDS, default="auto", help="engine (default auto: GPU if CuPy sees one)")
    _gpus_option(m, "searches a share of every query's partial matches")
    m.add_argument("--distinct", action="store_true", help="count each subgraph instance once (symmetry breaking)")
    m.add_argument("--limit", type=_positive_int, help="stop after N matches per query (complete: false)")
    m.add_argument("--time-limit", type=_positive_float, help="stop a query after S seconds (complete: false)")
    m.add_argument("--output", type=Path, help="write the matches to this Arrow IPC file (a pipe or device: the "
                   "IPC stream format; '-': the stream on standard output, the table on standard error)")
    m.add_argument("--json", action="store_true", help="one JSON object per query on stdout")
    m.add_argument("--at", type=_event_time, metavar="TS",
                   help="match the graph as it stood at event time TS: edges with a ts after TS are left out "
                        "(the graph's edges need a ts: e u v label ts, or a ts column; edges without one are kept)")
    m.add_argument("--window", type=_ts_span, metavar="W",
                   help="with --at: also leave out the edges with a ts before TS - W (what csmd replay --window "
                        "W keeps at watermark TS)")
    _id_options(m)
    _labels_option(m)
    m.set_defaults(func=cmd_match)

    r = sub.add_parser("replay", help="stream an update file through the continuous pipeline (no Kafka)")
    r.add_argument("--data", type=Path,
                   help="initial graph G0 (default: none, an empty graph whose ids are of the kind --ids says)")
    r.add_argument("--stream", required=True, type=Path, help="update stream: e/-e/v/-v lines")
    r.add_argument("--query", required=True, nargs="+", type=Path, help="query files or directories of them")
    r.add_argument("--backend", choices=BACKENDS, default="auto", help="engine (default auto)")
    _gpus_option(r, "holds the graph and searches a share of every large batch")
    r.add_argument("--batch-size", type=_batch_size,
                   help=f"updates per graph-updater batch (default {DEFAULT_BATCH_SIZE}; "
                        f"{COUNT_ONLY_REPLAY_BATCH} with --count-only)")
    r.add_argument("--count-only", action="store_true", help="count deltas, do not materialize matches")
    r.add_argument("--distinct", action="store_true",
                   help="one delta per subgraph instance, not one per automorphism (symmetry breaking)")
    r.add_argument("--output", type=Path, help="write every delta to this Arrow IPC file (a pipe or device: the "
                   "IPC stream format; '-': the stream on standard output, the table on standard error)")
    r.add_argument("--json", action="store_true", help="one JSON object per query on stdout")
    r.add_argument("--time", choices=("none", "event"),
                   help="event: every edge line carries a ts (e u v label ts), and --window expires edges")
    r.add_argument("--window", type=_ts_span, metavar="W",
                   help="event time: edges whose ts is below the watermark less W expire (0: none; implies "
                        "--time event)")
    r.add_argument("--lateness", type=_ts_span, metavar="L",
                   help="event time: the watermark trails the largest ts by L (default 0; implies --time event)")
    _id_options(r)
    _labels_option(r)
    r.set_defaults(func=cmd_replay)

    e = sub.add_parser("estimate", help="approximate match counts with 95%% confidence intervals (sampling)")
    e.add_argument("--data", required=True, type=Path, help="data graph (text format, .arrow or .parquet)")
    e.add_argument("--query", required=True, nargs="+", type=Path, help="query files or directories of them")
    _estimate_options(e)
    e.add_argument("--backend", choices=BACKENDS, default="auto", help="sampler (default auto: GPU if CuPy sees one)")
    e.add_argument("--json", action="store_true", help="one JSON object per query on stdout")
    _id_options(e, kinds=False)
    _labels_option(e)
    e.set_defaults(func=cmd_estimate)

    d = sub.add_parser("run", help="the daemon: Kafka in, match deltas out (stops cleanly on SIGTERM)")
    d.add_argument("--config", type=Path, help="TOML config (see configs/); CSMD_SECTION__KEY overrides a setting")
    d.set_defaults(func=cmd_run)

    a = sub.add_parser("admin", help="talk to a running daemon")
    a.add_argument("--url", default="http://127.0.0.1:8642", help="the daemon's admin endpoint ([admin] listen)")
    a.add_argument("--json", action="store_true", help="print the answer as JSON")
    acts = a.add_subparsers(dest="action", required=True)
    add = acts.add_parser("add", help="register a query (through the control topic)")
    add.add_argument("--query", required=True, type=Path, help="query graph file")
    add.add_argument("--name", help="query name (default: the file's stem)")
    add.add_argument("--count-only", action="store_true", help="publish counts per update, not matches")
    add.add_argument("--distinct", action="store_true",
                     help="one delta per subgraph instance, not one per automorphism (symmetry breaking)")
    add.add_argument("--estimate", action="store_true",
                     help=f"also estimate the query's matches in the live graph (at most {ADD_ESTIMATE_SECONDS:g} s "
                          "of sampling)")
    rm = acts.add_parser("remove", help="remove a registered query")
    rm.add_argument("--name", required=True)
    acts.add_parser("list", help="the registered queries")
    mt = acts.add_parser("match", help="one-shot static query against the live graph")
    mt.add_argument("--query", required=True, type=Path)
    mt.add_argument("--distinct", action="store_true")
    mt.add_argument("--limit", type=_positive_int)
    mt.add_argument("--time-limit", type=_positive_float)
    est = acts.add_parser("estimate", help="approximate count against the live graph (see csmd estimate)")
    est.add_argument("--query", required=True, type=Path)
    _estimate_options(est)
    acts.add_parser("stats", help="throughput, latency, queues, per-query totals")
    acts.add_parser("metrics", help="the Prometheus metrics text")
    acts.add_parser("health", help="whether the daemon is running")
    a.set_defaults(func=cmd_admin)

    b = sub.add_parser("broker", help="the embedded Kafka broker alone (prints its bootstrap address)")
    b.add_argument("--port", type=_positive_int,
                   help="port on 127.0.0.1 (default: the default config's, 9092; 0: any free port)")
    b.add_argument("--log", type=Path, help="append the broker's own log to this file (default: discarded)")
    b.set_defaults(func=cmd_broker)

    demo = sub.add_parser("demo", help="embedded broker + daemon + the human stream, with live delta counts")
    demo.add_argument("--config", type=Path, default=Path("configs/demo.toml"))
    demo.add_argument("--rate", type=float, default=500.0, help="updates per second to produce (default 500)")
    demo.add_argument("--keep", action="store_true",
                      help="after the stream, keep the broker and the daemon up for `csmd admin` until Ctrl-C")
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CsmdError as exc:
        print(f"csmd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"csmd {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
