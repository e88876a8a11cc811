"""The admin endpoint of a running daemon (HTTP, JSON) and the `csmd admin` client.

  GET    /health            200 while running, 503 while starting or stopping; and the broker connection
  GET    /metrics           Prometheus text format
  GET    /stats             counters, rates, latency, per-query totals
  GET    /queries           the registered queries
  POST   /queries           {"name", "query": text, "count_only", "distinct"}: register (through the control
                            topic); distinct: one delta per subgraph instance
  DELETE /queries/NAME      remove (through the control topic)
  POST   /match             {"query": text, "distinct", "limit", "time_limit"}: one-shot static
                            query against the live graph at a consistent timestamp
  POST   /estimate          {"query": text, "method", "samples", "rel_error", "time_limit", "seed", "trawl"}:
                            approximate count against the live graph at a consistent timestamp
"""

from __future__ import annotations

import json
import math
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from csmd.errors import CsmdError, NotYetApplied
from csmd.service.config import split_listen

MAX_BODY = 1 << 20


class AdminServer:
    """Serves one daemon's admin endpoint from a background thread."""

    def __init__(self, daemon, listen: str):
        self.daemon = daemon
        handler = type("Handler", (_Handler,), {"daemon": daemon})
        try:
            self.httpd = ThreadingHTTPServer(split_listen(listen), handler)
        except OSError as exc:
            raise CsmdError(f"admin endpoint cannot listen on {listen}: {exc.strerror or exc}") from None
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="csmd-admin", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def strict_json(body) -> bytes:
    """The body as JSON that strict parsers read: a number that is not finite (the quantile of a
    latency histogram with nothing in it yet, NaN) is null. json.dumps writes NaN, which is no JSON."""
    def finite(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return x
    return json.dumps(finite(body), allow_nan=False).encode()


class _Handler(BaseHTTPRequestHandler):
    daemon = None  # set per server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # requests are not worth a log line each
        pass

    def _send(self, code: int, body, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else strict_json(body)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting: nobody to answer
            self.close_connection = True

    def _body(self, fields: tuple[str, ...]) -> dict:
        """The request's JSON object, with no field but `fields` (a misspelt option is refused, not ignored)."""
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise CsmdError(f"request body over {MAX_BODY} bytes")
        try:
            doc = json.loads(self.rfile.read(n) or b"{}")
        except json.JSONDecodeError as exc:
            raise CsmdError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise CsmdError("request body must be a JSON object")
        unknown = sorted(set(doc) - set(fields))
        if unknown:
            raise CsmdError(f"unknown field(s) {', '.join(map(repr, unknown))}; this request takes {', '.join(fields)}")
        return doc

    def _guard(self, fn) -> None:
        try:
            fn()
        except NotYetApplied as exc:
            self._send(409, {"error": str(exc)})
        except CsmdError as exc:  # InputError included: a bad request
            self._send(400, {"error": str(exc)})
        except Exception as exc:  # the endpoint reports; the daemon goes on
            self.daemon.log.exception("admin request failed", path=self.path)
            self._send(500, {"error": repr(exc)})

    def _changed(self, result: dict) -> None:
        """A control change's outcome: 409 when it took effect as a refusal (removing an unknown name)."""
        self._send(409 if result.get("error") else 200, result)

    def do_GET(self):
        d = self.daemon
        if self.path == "/health":
            ok = d.status == "running"
            self._send(200 if ok else 503, {"status": d.status, "fatal": d.fatal, **d.kafka_state()})
        elif self.path == "/metrics":
            self._guard(lambda: self._send(200, d.metrics.prometheus(), "text/plain; version=0.0.4"))
        elif self.path == "/stats":
            self._guard(lambda: self._send(200, d.stats()))
        elif self.path == "/queries":
            self._send(200, {"queries": [{"name": s.name, "count_only": s.count_only, "distinct": s.distinct,
                                          "query": s.text}
                                         for s in list(d.specs.values())]})
        else:
            self._send(404, {"error": f"no such endpoint {self.path}"})

    def do_POST(self):
        d = self.daemon
        if self.path == "/queries":
            def add():
                body = self._body(("name", "query", "count_only", "distinct"))
                msg = {"op": "add", "name": body.get("name"), "query": body.get("query"),
                       "count_only": body.get("count_only", False), "distinct": body.get("distinct", False)}
                self._changed(d.request_change(msg))
            self._guard(add)
        elif self.path == "/match":
            self._guard(lambda: self._send(200, _match(d, self._body(("name", "query", "distinct", "limit",
                                                                       "time_limit")))))
        elif self.path == "/estimate":
            self._guard(lambda: self._send(200, _estimate(d, self._body(("name", "query", "method", "samples",
                                                                          "rel_error", "time_limit", "seed",
                                                                          "trawl")))))
        else:
            self._send(404, {"error": f"no such endpoint {self.path}"})

    def do_DELETE(self):
        d = self.daemon
        if self.path.startswith("/queries/"):
            name = unquote(self.path[len("/queries/"):])
            self._guard(lambda: self._changed(d.request_change({"op": "remove", "name": name})))
        else:
            self._send(404, {"error": f"no such endpoint {self.path}"})


def _query(body: dict, labels):
    """The request's (name, query graph), label names read by `labels`; a bad query is a 400 naming its line."""
    from csmd.model.formats import parse_query_text

    text = body.get("query")
    if not isinstance(text, str):
        raise CsmdError("\"query\" must be the query graph as text")
    name = body.get("name") or "query"
    return name, parse_query_text(text, name, labels)


def _match(daemon, body: dict) -> dict:
    from csmd.jobs.match import run_query

    name, q = _query(body, daemon.labels)
    g, seq = daemon.live_graph()
    res = run_query(g, q, name, backend=daemon.pipe.engine.name, distinct=bool(body.get("distinct", False)),
                    limit=_number(body, "limit", int), time_limit=_number(body, "time_limit", float),
                    gpus=daemon.cfg.pipeline.gpus if daemon.pipe.engine.name == "gpu" else 1)
    return {**res, "seq": seq, "vertices": g.n, "edges": g.num_edges}


def _estimate(daemon, body: dict) -> dict:
    """The sampler runs where the daemon's engine runs, on the host copy of the live graph at `seq`
    (on the GPU engine, its candidate graph built on the device or uploaded, whichever is faster)."""
    from csmd.backends import sampler_backend
    from csmd.jobs.estimate import run_estimate

    name, q = _query(body, daemon.labels)
    if body.get("samples") is not None and body.get("rel_error") is not None:
        raise CsmdError("give \"samples\" or \"rel_error\", not both")
    trawl = _number(body, "trawl", int, zero_ok=True) or 0
    g, seq = daemon.live_graph()
    res = run_estimate(g, q, name, method=body.get("method", "auto"), samples=_number(body, "samples", int),
                       rel_error=_number(body, "rel_error", float), time_limit=_number(body, "time_limit", float),
                       seed=_number(body, "seed", int, zero_ok=True) or 0,
                       trawl=trawl, backend=sampler_backend(daemon.pipe.engine.name, g.directed))
    return {**res, "seq": seq, "vertices": g.n, "edges": g.num_edges}


def _number(body: dict, key: str, kind, zero_ok: bool = False):
    """body[key] as a positive `kind` (or 0 with zero_ok), None when absent."""
    val = body.get(key)
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, (int, float)) or (kind is int and not float(val).is_integer()) \
            or val < 0 or (val == 0 and not zero_ok):
        what = "integer" if kind is int else "number"
        raise CsmdError(f"\"{key}\" must be a {'non-negative' if zero_ok else 'positive'} {what}, not {val!r}")
    return kind(val)


# ---- the client (`csmd admin`) ------------------------------------------------------------------------
def call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 60.0):
    """One request to the admin endpoint; the decoded JSON (or text for /metrics). `path` is sent
    as given: a caller quotes what it puts in it (urllib.parse.quote)."""
    if not url.startswith(("http://", "https://")):
        raise CsmdError(f"admin URL {url!r} must start with http:// (like http://127.0.0.1:8642)")
    data = None if body is None else json.dumps(body).encode()
    try:
        req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    except ValueError as exc:
        raise CsmdError(f"admin URL {url!r}: {exc}") from None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            reason = json.loads(raw).get("error", raw.decode())
        except (json.JSONDecodeError, AttributeError):
            reason = raw.decode(errors="replace")
        raise CsmdError(f"{method} {path}: {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CsmdError(f"no csmd daemon answers at {url}: {getattr(exc, 'reason', exc)}") from None
    return json.loads(raw) if ctype.startswith("application/json") else raw.decode()
