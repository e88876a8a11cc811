"""The daemon's TOML configuration: defaults, the file, then environment overrides.

`CSMD_<SECTION>__<KEY>=value` overrides one setting (CSMD_KAFKA__BOOTSTRAP=host:9092);
the value is read as the setting's type. Unknown sections and keys, and values of
the wrong type, are errors that name the file (or variable) and the key. Relative
paths in a file are relative to the file's folder.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from csmd.errors import CsmdError
from csmd.model.labels import LabelNames

DEFAULTS: dict[str, dict] = {
    "kafka": {
        "bootstrap": "127.0.0.1:9092",
        "group": "csmd",  # consumer group the input offsets are committed under
        "transactions": False,  # exactly-once: deltas and offsets in one Kafka transaction
        "transactional_id": "csmd",
        "client": {},  # extra librdkafka settings for every client (security.protocol, sasl.*, ...)
        "consumer": {},  # librdkafka settings for the consumers only (fetch.*, queued.*, ...)
        "producer": {},  # librdkafka settings for the producers only (linger.ms, compression.type, ...)
        # where a partition starts with no checkpoint and no committed offset (and where one whose
        # offset is out of range continues): "earliest" reads the whole topic, "latest" only new records
        "offset_reset": "earliest",
    },
    "topics": {
        "input": "csmd.updates",
        "output": "csmd.deltas",
        "control": "csmd.control",
        "dead_letter": "csmd.dead-letters",
        "create": True,  # create missing topics at start
        "partitions": 1,  # input partitions when csmd creates the topic; one keeps the update order total
        "replication": 1,
        "max_message_bytes": 1_000_000,  # every produced record stays under this (Kafka's default limit)
    },
    "input": {
        "format": "auto",  # auto | arrow | json | text
        # records taken in one poll (backpressure's room permitting): every poll costs the consume
        # loop and the updater a step of bookkeeping whatever its size, and a cluster instance
        # pays it for every record (500 held the human stream at 48k upd/s, 5000 gave 76k)
        "max_poll_records": 5000,
    },
    "graph": {
        "initial": "",  # initial data graph (any csmd format); empty: start from an empty graph
        # the vertex ids' kind: auto takes the initial graph's (int without one); "string" lets a
        # deployment keyed by strings start empty, "int" or "string" with a graph of the other kind stops the start
        "ids": "auto",
        # the longest string vertex id in UTF-8 bytes (longer ones and empty ones are dead letters): every
        # match, delta and checkpoint holds its ids (one of 100,000 characters made 100 inserts take 46 s)
        "max_id_bytes": 256,
        # names that stand for labels in graph, query and update text and in JSON/Arrow records:
        # { account = 0, device = 1 } (model/labels.py)
        "labels": {},
        "edge_labels": {},
        # edges are arcs: e u v is u -> v, and a query's edges need the same direction (model/direction.py);
        # the checkpoints and the cluster's deployment record hold it
        "directed": False,
    },
    "queries": {
        "paths": [],  # query files or folders registered at every start
        "count_only": False,  # publish one count per update instead of every match
        "distinct": False,  # one delta per subgraph instance, not one per automorphism
    },
    "pipeline": {
        "backend": "auto",
        "batch_size": 64,
        "batch_wait_ms": 0.125,
        # while the executor is behind, a batch takes up to this many records (never fewer than
        # batch_size): high rates are matched in large batches, low ones in small batches. Each
        # batch costs host work whatever its size (a graph version per touched vertex, a Kafka
        # record per query): 16384, not 4096, took a 4-instance cluster on the human stream from
        # 1.30x to 2.00x its single instance's rate (bench/cluster.py, same H100 host)
        "max_batch": 16384,
        "queue_depth": 4,
        # the consumer pauses above this many records in flight: some 5 of the largest batches,
        # so that the updater can form the next while the executor works
        "max_pending_records": 80_000,
        "threads": 0,  # the compiled CPU engine's threads; 0: CSMD_THREADS, else the cores
    },
    "delivery": {
        "commit_interval_ms": 200,
        # a record the broker has not acknowledged after this long (librdkafka retries with
        # backoff meanwhile) stops the daemon, uncommitted: a restart sends it again
        "timeout_s": 120.0,
    },
    "checkpoint": {
        "dir": "",  # empty: no checkpoints (a restart rebuilds from the initial graph and the topic)
        "interval_s": 60.0,
        "keep": 2,
        # a checkpoint or committed offset beyond the end of the input topic (recreated, another
        # cluster): "fail" refuses to start and says why; "rebuild" starts over from [graph] initial
        "on_mismatch": "fail",
    },
    "cluster": {
        "enabled": False,  # share the matching work with the other instances of [cluster] group
        "shards": 12,  # matching work units; fixed for the life of a deployment (the coordination topic's partitions)
        "group": "csmd.cluster",  # consumer group of the instances; the coordination topic is "<group>.shards"
        "instance": "",  # this instance's name in stats and the csmd-instance header; empty: host-pid
        "session_timeout_ms": 10_000,  # an instance silent this long loses its shards (the failover time)
        # the kept batches (and the versions they read) since the slowest shard's progress; at the
        # limit the input pauses until that shard moves (its owner recovers or Kafka reassigns it)
        "max_retained_updates": 1_000_000,
    },
    "output": {
        # what of the input record that caused a delta its row carries besides the record's key
        # (the delta columns headers and fields): these Kafka headers, and these fields of a
        # JSON update (or columns of an Arrow row)
        "carry_headers": [],
        "carry_fields": [],
    },
    "admin": {
        "listen": "127.0.0.1:8642",  # the admin and /metrics endpoint; empty: off
    },
    "log": {
        "format": "auto",  # json | console | auto (console on a terminal, else json)
        "level": "info",
    },
}
_PATHS = {("graph", "initial"), ("queries", "paths"), ("checkpoint", "dir")}
_CHOICES = {("input", "format"): ("auto", "arrow", "json", "text"), ("graph", "ids"): ("auto", "int", "string"), ("kafka", "offset_reset"): ("earliest", "latest"), ("pipeline", "backend"): ("auto", "cpu", "numpy", "gpu"),
            ("log", "format"): ("auto", "json", "console"),
            ("checkpoint", "on_mismatch"): ("fail", "rebuild"), ("log", "level"): ("debug", "info", "warning", "error")}
_POSITIVE = {("topics", "partitions"), ("topics", "replication"), ("topics", "max_message_bytes"),
             ("input", "max_poll_records"), ("graph", "max_id_bytes"), ("pipeline", "batch_size"), ("pipeline", "max_batch"),
             ("pipeline", "queue_depth"),
             ("pipeline", "max_pending_records"), ("delivery", "commit_interval_ms"), ("delivery", "timeout_s"), ("checkpoint", "interval_s"),
             ("checkpoint", "keep"), ("pipeline", "batch_wait_ms"), ("cluster", "shards"),
             ("cluster", "session_timeout_ms"), ("cluster", "max_retained_updates")}
_NON_NEGATIVE = {("pipeline", "threads")}


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), 1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}[type(v)]


def _check(where: str, section: str, key: str, value, default):
    """The value, converted where harmless (an int for a float); CsmdError if it has the wrong type."""
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if type(value) is not type(default):
        raise CsmdError(f"{where}: [{section}] {key} must be {_type_name(default)}, got {value!r}")
    if isinstance(default, list) and not all(isinstance(x, str) for x in value):
        raise CsmdError(f"{where}: [{section}] {key} must be a list of strings")
    if (section, key) in _CHOICES and value not in _CHOICES[section, key]:
        raise CsmdError(f"{where}: [{section}] {key} must be one of {', '.join(_CHOICES[section, key])}, got {value!r}")
    if (section, key) in _POSITIVE and not value > 0:
        raise CsmdError(f"{where}: [{section}] {key} must be > 0, got {value!r}")
    if (section, key) in _NON_NEGATIVE and value < 0:
        raise CsmdError(f"{where}: [{section}] {key} must be >= 0, got {value!r}")
    return value


def _from_env(text: str, default, var: str):
    if isinstance(default, bool):
        low = text.strip().lower()
        if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise CsmdError(f"{var}: expected a boolean (true/false), got {text!r}")
        return low in ("1", "true", "yes", "on")
    if isinstance(default, (int, float)):
        try:
            return type(default)(text)
        except ValueError:
            raise CsmdError(f"{var}: expected {_type_name(default)}, got {text!r}") from None
    if isinstance(default, list):
        return [p.strip() for p in text.split(",") if p.strip()]
    if isinstance(default, dict):
        try:
            return tomllib.loads(f"x = {text}")["x"]
        except tomllib.TOMLDecodeError as exc:
            raise CsmdError(f"{var}: expected an inline TOML table like {{ key = \"value\" }}: {exc}") from None
    return text


def load_config(path=None, env=None) -> dict[str, dict]:
    """Defaults, overlaid by the TOML file at `path` (if any) and by CSMD_* variables of `env`."""
    cfg = copy.deepcopy(DEFAULTS)
    env = os.environ if env is None else env
    base = Path.cwd()
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise CsmdError(f"{path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise CsmdError(f"{path}: not valid TOML: {exc}") from None
        base = path.resolve().parent
        for section, values in data.items():
            if section not in cfg:
                raise CsmdError(f"{path}: unknown section [{section}]{_suggest(section, cfg)}")
            if not isinstance(values, dict):
                raise CsmdError(f"{path}: [{section}] must be a table")
            for key, value in values.items():
                if key not in cfg[section]:
                    raise CsmdError(f"{path}: unknown key [{section}] {key}{_suggest(key, cfg[section])}")
                cfg[section][key] = _check(str(path), section, key, value, DEFAULTS[section][key])
        for section, key in _PATHS:  # relative to the file, so a config works from any folder
            value = cfg[section][key]
            if section in data and key in data[section]:
                cfg[section][key] = [str(base / p) for p in value] if isinstance(value, list) else \
                    (str(base / value) if value else value)
    origin = {}  # (section, key) -> the file or variable that set it, for errors found below
    if path is not None:
        origin = {(sec, key): str(path) for sec, values in data.items() for key in values}
    for var, text in sorted(env.items()):
        if not var.startswith("CSMD_") or "__" not in var:
            continue
        section, _, key = var[5:].lower().partition("__")
        if section not in cfg or key not in cfg[section]:
            raise CsmdError(f"{var}: no setting [{section}] {key}")
        cfg[section][key] = _check(var, section, key, _from_env(text, DEFAULTS[section][key], var),
                                   DEFAULTS[section][key])
        origin[section, key] = var
    _check_listen(cfg["admin"]["listen"], origin.get(("admin", "listen"), "defaults"))
    g = cfg["graph"]  # each table checked alone, so that an error names where that one was set
    LabelNames.from_tables(g["labels"], {}, origin.get(("graph", "labels"), "defaults"), "[graph] ")
    LabelNames.from_tables({}, g["edge_labels"], origin.get(("graph", "edge_labels"), "defaults"), "[graph] ")
    _check_together(cfg, origin)
    if cfg["cluster"]["enabled"] and cfg["kafka"]["transactions"]:
        raise CsmdError(f"{origin.get(('cluster', 'enabled'), 'defaults')}: [cluster] enabled does not work with "
                        f"[kafka] transactions (each shard commits its own progress, outside any transaction)")
    _check_librdkafka(cfg["kafka"], origin)
    return cfg


def label_names(cfg: dict) -> LabelNames:
    """[graph] labels and edge_labels (checked when the config loaded), and [graph] directed."""
    return LabelNames(cfg["graph"]["labels"], cfg["graph"]["edge_labels"], cfg["graph"]["directed"])


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
MAX_SHARDS = 1000  # a shard is a committed offset in every progress commit and floor read
SESSION_TIMEOUT_MS = (1000, 3_600_000)  # below a second a heartbeat cannot keep a member in its group
MIN_MESSAGE_BYTES = 10_000  # a delta row of a 32-vertex match with long string ids must fit


def _check_together(cfg: dict, origin: dict) -> None:
    """What no single value shows: topic names (valid, and four different topics: a dead-letter
    topic that is the input would feed every refused record back in, forever), batch sizes in
    order, the checkpoint folder not a file."""
    t = cfg["topics"]
    names = {key: t[key] for key in ("input", "output", "control", "dead_letter")}
    if cfg["cluster"]["enabled"]:
        _check_cluster(cfg, origin)
        names["cluster group's coordination topic"] = f"{cfg['cluster']['group']}.shards"
    for key, name in names.items():
        if key in t and not _TOPIC_NAME.fullmatch(name):
            raise CsmdError(f"{origin.get(('topics', key), 'defaults')}: [topics] {key} must be a Kafka topic name "
                            f"(1 to 249 of A-Z a-z 0-9 . _ -), got {name!r}")
    seen: dict[str, str] = {}
    for key, name in names.items():
        if name in seen:
            raise CsmdError(f"{origin.get(('topics', key), origin.get(('topics', seen[name]), 'defaults'))}: "
                            f"[topics] {seen[name]} and {key} are the same topic {name!r}; each needs its own")
        seen[name] = key
    if t["max_message_bytes"] < MIN_MESSAGE_BYTES:
        raise CsmdError(f"{origin.get(('topics', 'max_message_bytes'), 'defaults')}: [topics] max_message_bytes must "
                        f"be at least {MIN_MESSAGE_BYTES}, got {t['max_message_bytes']}")
    for key in ("carry_headers", "carry_fields"):  # each name is a key of the delta's map: once, not empty
        names = cfg["output"][key]
        if "" in names or len(set(names)) < len(names):
            raise CsmdError(f"{origin.get(('output', key), 'defaults')}: [output] {key} must name each "
                            f"{key[6:-1]} once, none empty, got {names!r}")
    p = cfg["pipeline"]
    if p["batch_size"] > p["max_batch"]:
        where = origin.get(("pipeline", "batch_size"), origin.get(("pipeline", "max_batch"), "defaults"))
        raise CsmdError(f"{where}: [pipeline] batch_size ({p['batch_size']}) must not exceed max_batch ({p['max_batch']})")
    ckpt = cfg["checkpoint"]["dir"]
    if ckpt and Path(ckpt).exists() and not Path(ckpt).is_dir():
        raise CsmdError(f"{origin.get(('checkpoint', 'dir'), 'defaults')}: [checkpoint] dir {ckpt} is not a folder")


def _check_cluster(cfg: dict, origin: dict) -> None:
    """[cluster] values that Kafka or the client would take and then misbehave on: a group whose
    coordination topic cannot exist (the client aborted the process on an empty one), more shards
    than a group commits in time (the commits timed out and nothing was delivered), a session
    timeout shorter than a heartbeat round trip (both instances kept every shard, each publishing
    everything), and input partitions (the cluster needs one: the update order)."""
    c = cfg["cluster"]

    def where(section, key):
        return origin.get((section, key), "defaults")

    if not _TOPIC_NAME.fullmatch(f"{c['group']}.shards") or not c["group"]:
        raise CsmdError(f"{where('cluster', 'group')}: [cluster] group must be 1 to 242 of A-Z a-z 0-9 . _ - "
                        f"(its coordination topic is <group>.shards), got {c['group']!r}")
    if c["shards"] > MAX_SHARDS:
        raise CsmdError(f"{where('cluster', 'shards')}: [cluster] shards must be at most {MAX_SHARDS}, got {c['shards']}")
    lo, hi = SESSION_TIMEOUT_MS
    if not lo <= c["session_timeout_ms"] <= hi:
        raise CsmdError(f"{where('cluster', 'session_timeout_ms')}: [cluster] session_timeout_ms must be {lo} to "
                        f"{hi}, got {c['session_timeout_ms']}")
    if cfg["topics"]["partitions"] != 1:
        raise CsmdError(f"{where('topics', 'partitions')}: [topics] partitions must be 1 with [cluster] enabled "
                        f"(every instance applies the input in one order), got {cfg['topics']['partitions']}")


def split_listen(listen: str) -> tuple[str, int]:
    """(host, port) of a host:port setting; CsmdError unless the port is 0 .. 65535."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CsmdError(f"[admin] listen must be host:port with a port in 0 .. 65535, got {listen!r}")
    return host or "127.0.0.1", int(port)


def _check_listen(listen: str, where: str) -> None:
    if listen:
        try:
            split_listen(listen)
        except CsmdError as exc:
            raise CsmdError(f"{where}: {exc}") from None


def _check_librdkafka(kafka: dict, origin: dict) -> None:
    """Refuse unknown librdkafka settings, bad values and settings csmd must own, when the config
    loads rather than when the first client is made (each error names where the setting came from).
    Settings that only fail together (sasl.* still missing a password from the environment) are
    reported when the daemon makes its clients."""
    from confluent_kafka import Consumer, KafkaException, Producer

    from csmd.connectors.kafka import FIXED, librdkafka_settings

    quiet = {"log_level": 0, "logger": _Silent()}
    for table, make in (("client", None), ("consumer", Consumer), ("producer", Producer)):
        where = origin.get(("kafka", table), "defaults")
        for key in kafka[table]:
            if key in FIXED:
                raise CsmdError(f"{where}: [kafka] {table}: {key!r} is set by {FIXED[key]}, not here")
        for cls in (Consumer, Producer) if make is None else (make,):
            extra = {"group.id": "csmd-config-check"} if cls is Consumer else {}
            try:
                made = cls({**quiet, **extra, **librdkafka_settings(kafka[table])})
            except (KafkaException, ValueError, TypeError) as exc:
                reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
                if reason.startswith("Failed to create"):  # a combination, not one setting
                    continue
                raise CsmdError(f"{where}: [kafka] {table}: {reason}") from None
            if cls is Consumer:
                made.close()


class _Silent:
    """A logger for the throwaway clients of the check (no broker is contacted)."""

    def log(self, *args):
        pass
