"""The daemon's configuration: typed sections with their defaults, then the TOML file, then
environment overrides.

`load_config(path, env)` gives a `Config`: one frozen dataclass per [section] (cfg.kafka.bootstrap,
cfg.pipeline.batch_size, ...), each field a setting with its default. configs/default.toml lists
the same settings with the same defaults (tests/test_daemon_parts.py holds them together).

`CSMD_<SECTION>__<KEY>=value` overrides one setting (CSMD_KAFKA__BOOTSTRAP=host:9092);
the value is read as the setting's type. Unknown sections and keys, and values of
the wrong type, are errors that name the file (or variable) and the key. Relative
paths in a file are relative to the file's folder.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from csmd.errors import CsmdError
from csmd.model.labels import LabelNames
from csmd.pipeline.event_time import EventTime


def _setting(default, *, choices: tuple = (), positive: bool = False, non_negative: bool = False,
             path: bool = False, also: tuple = ()):
    """A setting's default (a fresh empty list or table for each config) and what a value must be:
    one of `choices`, > 0, >= 0; `path`: relative to the config file's folder; `also`: strings
    taken besides values of the default's type (a count's "all")."""
    rules = {"choices": choices, "positive": positive, "non_negative": non_negative, "path": path, "also": also}
    if isinstance(default, (list, dict)):
        assert not default, "a list or table setting defaults to empty"
        return field(default_factory=type(default), metadata=rules)
    return field(default=default, metadata=rules)


@dataclass(frozen=True)
class KafkaConfig:
    """[kafka]: where the brokers are and how csmd's clients talk to them."""

    bootstrap: str = "127.0.0.1:9092"
    group: str = "csmd"  # consumer group the input offsets are committed under
    transactions: bool = False  # exactly-once: deltas and offsets in one Kafka transaction
    transactional_id: str = "csmd"
    # librdkafka settings passed through as they are (checked when the config loads): for every
    # client (security.protocol, sasl.*, ...), for the consumers only (fetch.*, queued.*, ...)
    # and for the producers only (linger.ms, compression.type, ...)
    client: dict[str, object] = _setting({})
    consumer: dict[str, object] = _setting({})
    producer: dict[str, object] = _setting({})
    # where a partition starts with no checkpoint and no committed offset (and where one whose
    # offset is out of range continues): "earliest" reads the whole topic, "latest" only new records
    offset_reset: str = _setting("earliest", choices=("earliest", "latest"))


@dataclass(frozen=True)
class TopicsConfig:
    """[topics]: the four topics csmd reads and writes, four different ones."""

    input: str = "csmd.updates"  # update records
    output: str = "csmd.deltas"  # match deltas
    control: str = "csmd.control"  # query registrations (durable, replayed on restart)
    dead_letter: str = "csmd.dead-letters"  # records csmd refused, with the reason
    create: bool = True  # create missing topics at start
    # input partitions when csmd creates the topic; one keeps the update order total
    partitions: int = _setting(1, positive=True)
    replication: int = _setting(1, positive=True)
    # every produced record stays under this (Kafka's default limit)
    max_message_bytes: int = _setting(1_000_000, positive=True)


@dataclass(frozen=True)
class InputConfig:
    """[input]: how update records are read."""

    format: str = _setting("auto", choices=("auto", "arrow", "json", "text"))
    # records taken in one poll (backpressure's room permitting): every poll costs the consume
    # loop and the updater a step of bookkeeping whatever its size, and a cluster instance pays
    # it for every record, so polls are large (bench/README.md says what 500 and 5000 gave)
    max_poll_records: int = _setting(5000, positive=True)


@dataclass(frozen=True)
class GraphConfig:
    """[graph]: the data graph csmd starts from and how records name its vertices and labels."""

    initial: str = _setting("", path=True)  # initial data graph (any csmd format); empty: start from an empty graph
    # the vertex ids' kind: auto takes the initial graph's (int without one); "string" lets a
    # deployment keyed by strings start empty, "int" or "string" with a graph of the other kind stops the start
    ids: str = _setting("auto", choices=("auto", "int", "string"))
    # the longest string vertex id in UTF-8 bytes (longer ones and empty ones are dead letters): every
    # match, delta and checkpoint holds its ids, so one huge id slows all that holds it
    max_id_bytes: int = _setting(256, positive=True)
    # names that stand for labels in graph, query and update text and in JSON/Arrow records:
    # { account = 0, device = 1 } (model/labels.py)
    labels: dict[str, int] = _setting({})
    edge_labels: dict[str, int] = _setting({})
    # edges are arcs: e u v is u -> v, and a query's edges need the same direction (model/direction.py);
    # the checkpoints and the cluster's deployment record hold it
    directed: bool = False
    # event time (pipeline/event_time.py): "event" reads a ts on every edge update (refusing one
    # without) and expires the edges whose ts falls below the watermark less `window` (0: none
    # expire); the watermark trails the largest ts applied by `lateness`
    time: str = _setting("none", choices=("none", "event"))
    window: int = _setting(0, non_negative=True)
    lateness: int = _setting(0, non_negative=True)

    def event_time(self) -> EventTime | None:
        """The pipeline's event-time settings (None: time = "none")."""
        return EventTime(self.window or None, self.lateness) if self.time == "event" else None


@dataclass(frozen=True)
class QueriesConfig:
    """[queries]: the queries registered at every start and what their deltas are."""

    paths: list[str] = _setting([], path=True)  # query files or folders
    count_only: bool = False  # publish one count per update instead of every match
    distinct: bool = False  # one delta per subgraph instance, not one per automorphism


@dataclass(frozen=True)
class PipelineConfig:
    """[pipeline]: the matching engine and how updates are batched for it."""

    backend: str = _setting("auto", choices=("auto", "cpu", "numpy", "gpu"))
    batch_size: int = _setting(64, positive=True)
    # how long a forming batch waits for more records once none is waiting: 0, since records that
    # arrive while a batch runs make the next batch anyway (a wait of 0.125 ms cost every record
    # of a quiet stream as much, and gained no throughput)
    batch_wait_ms: float = _setting(0.0, non_negative=True)
    # while the executor is behind, a batch takes up to this many records (never fewer than
    # batch_size): high rates are matched in large batches, low ones in small batches. Each
    # batch costs host work whatever its size (a graph version per touched vertex, a Kafka
    # record per query), so the limit is high (bench/README.md has the measurement)
    max_batch: int = _setting(16384, positive=True)
    queue_depth: int = _setting(4, positive=True)
    # the consumer pauses above this many records in flight: some 5 of the largest batches,
    # so that the updater can form the next while the executor works
    max_pending_records: int = _setting(80_000, positive=True)
    # the compiled CPU engine's threads; 0: CSMD_THREADS, else the cores
    threads: int = _setting(0, non_negative=True)
    # the GPU engine's devices: the first this many, or "all": each holds a replica of the graph and
    # searches a share of every batch large enough to split (gpu/replicas.py)
    gpus: int | str = _setting(1, positive=True, also=("all",))


@dataclass(frozen=True)
class DeliveryConfig:
    """[delivery]: committing the input offsets and waiting for the broker's acknowledgements."""

    commit_interval_ms: int = _setting(200, positive=True)
    # a record the broker has not acknowledged after this long (librdkafka retries with
    # backoff meanwhile) stops the daemon, uncommitted: a restart sends it again
    timeout_s: float = _setting(120.0, positive=True)


@dataclass(frozen=True)
class CheckpointConfig:
    """[checkpoint]: the graph and offsets saved so that a restart need not re-read the topic."""

    dir: str = _setting("", path=True)  # empty: no checkpoints (a restart rebuilds from the initial graph and the topic)
    interval_s: float = _setting(60.0, positive=True)
    keep: int = _setting(2, positive=True)
    # a checkpoint or committed offset beyond the end of the input topic (recreated, another
    # cluster): "fail" refuses to start and says why; "rebuild" starts over from [graph] initial
    on_mismatch: str = _setting("fail", choices=("fail", "rebuild"))


@dataclass(frozen=True)
class ClusterConfig:
    """[cluster]: sharing the matching work with other instances (docs/scale-out.md)."""

    enabled: bool = False  # share the matching work with the other instances of [cluster] group
    # matching work units; fixed for the life of a deployment (the coordination topic's partitions)
    shards: int = _setting(12, positive=True)
    group: str = "csmd.cluster"  # consumer group of the instances; the coordination topic is "<group>.shards"
    instance: str = ""  # this instance's name in stats and the csmd-instance header; empty: host-pid
    # an instance silent this long loses its shards (the failover time)
    session_timeout_ms: int = _setting(10_000, positive=True)
    # the kept batches (and the versions they read) since the slowest shard's progress; at the
    # limit the input pauses until that shard moves (its owner recovers or Kafka reassigns it)
    max_retained_updates: int = _setting(1_000_000, positive=True)


@dataclass(frozen=True)
class OutputConfig:
    """[output]: what of the input record that caused a delta its row carries besides the
    record's key (the delta columns headers and fields)."""

    carry_headers: list[str] = _setting([])  # these Kafka headers
    carry_fields: list[str] = _setting([])  # these fields of a JSON update (or columns of an Arrow row)


@dataclass(frozen=True)
class AdminConfig:
    """[admin]: the HTTP endpoint for queries, stats, /metrics and /health."""

    listen: str = "127.0.0.1:8642"  # host:port; empty: off


@dataclass(frozen=True)
class LogConfig:
    """[log]: the daemon's log lines."""

    format: str = _setting("auto", choices=("auto", "json", "console"))  # console on a terminal, else json
    level: str = _setting("info", choices=("debug", "info", "warning", "error"))


@dataclass(frozen=True)
class Config:
    """Every setting, by section; `Config()` is the defaults, `load_config` what a deployment set."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    input: InputConfig = field(default_factory=InputConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    queries: QueriesConfig = field(default_factory=QueriesConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def as_dict(self) -> dict[str, dict]:
        """{section: {key: value}}, as a TOML file writes it (fresh copies of lists and tables)."""
        return asdict(self)


_SECTIONS = {f.name: f.default_factory for f in fields(Config)}  # section name -> its dataclass
_RULES = {(section, f.name): f.metadata for section, cls in _SECTIONS.items() for f in fields(cls)}


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), 1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}[type(v)]


def _or_also(also: tuple) -> str:
    """The strings a setting takes besides its type's values, for an error: " or 'all'"."""
    return "".join(f" or {a!r}" for a in also)


def _check(where: str, section: str, key: str, value, default):
    """The value, converted where harmless (an int for a float); CsmdError if it has the wrong type."""
    rules = _RULES[section, key]
    if isinstance(value, str) and value in rules.get("also", ()):
        return value
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if type(value) is not type(default):
        raise CsmdError(f"{where}: [{section}] {key} must be {_type_name(default)}{_or_also(rules.get('also', ()))}, "
                        f"got {value!r}")
    if isinstance(default, list) and not all(isinstance(x, str) for x in value):
        raise CsmdError(f"{where}: [{section}] {key} must be a list of strings")
    if rules.get("choices") and value not in rules["choices"]:
        raise CsmdError(f"{where}: [{section}] {key} must be one of {', '.join(rules['choices'])}, got {value!r}")
    if rules.get("positive") and not value > 0:
        raise CsmdError(f"{where}: [{section}] {key} must be > 0, got {value!r}")
    if rules.get("non_negative") and value < 0:
        raise CsmdError(f"{where}: [{section}] {key} must be >= 0, got {value!r}")
    return value


def _from_env(text: str, default, var: str, also: tuple = ()):
    if text in also:
        return text
    if isinstance(default, bool):
        low = text.strip().lower()
        if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise CsmdError(f"{var}: expected a boolean (true/false), got {text!r}")
        return low in ("1", "true", "yes", "on")
    if isinstance(default, (int, float)):
        try:
            return type(default)(text)
        except ValueError:
            raise CsmdError(f"{var}: expected {_type_name(default)}{_or_also(also)}, got {text!r}") from None
    if isinstance(default, list):
        return [p.strip() for p in text.split(",") if p.strip()]
    if isinstance(default, dict):
        try:
            return tomllib.loads(f"x = {text}")["x"]
        except tomllib.TOMLDecodeError as exc:
            raise CsmdError(f"{var}: expected an inline TOML table like {{ key = \"value\" }}: {exc}") from None
    return text


def load_config(path=None, env=None) -> Config:
    """Defaults, overlaid by the TOML file at `path` (if any) and by CSMD_* variables of `env`."""
    defaults, values = Config().as_dict(), Config().as_dict()  # values: section -> key -> value, overlaid below
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
        for section, table in data.items():
            if section not in values:
                raise CsmdError(f"{path}: unknown section [{section}]{_suggest(section, values)}")
            if not isinstance(table, dict):
                raise CsmdError(f"{path}: [{section}] must be a table")
            for key, value in table.items():
                if key not in values[section]:
                    raise CsmdError(f"{path}: unknown key [{section}] {key}{_suggest(key, values[section])}")
                value = _check(str(path), section, key, value, defaults[section][key])
                if _RULES[section, key].get("path"):  # relative to the file, so a config works from any folder
                    value = [str(base / p) for p in value] if isinstance(value, list) else \
                        (str(base / value) if value else value)
                values[section][key] = value
    origin = {}  # (section, key) -> the file or variable that set it, for errors found below
    if path is not None:
        origin = {(sec, key): str(path) for sec, table in data.items() for key in table}
    for var, text in sorted(env.items()):
        if not var.startswith("CSMD_") or "__" not in var:
            continue
        section, _, key = var[5:].lower().partition("__")
        if section not in values or key not in values[section]:
            raise CsmdError(f"{var}: no setting [{section}] {key}")
        default = defaults[section][key]
        also = _RULES[section, key].get("also", ())
        values[section][key] = _check(var, section, key, _from_env(text, default, var, also), default)
        origin[section, key] = var
    cfg = Config(**{section: _SECTIONS[section](**table) for section, table in values.items()})
    _check_listen(cfg.admin.listen, origin.get(("admin", "listen"), "defaults"))
    g = cfg.graph  # each table checked alone, so that an error names where that one was set
    LabelNames.from_tables(g.labels, {}, origin.get(("graph", "labels"), "defaults"), "[graph] ")
    LabelNames.from_tables({}, g.edge_labels, origin.get(("graph", "edge_labels"), "defaults"), "[graph] ")
    _check_together(cfg, origin)
    if cfg.cluster.enabled and cfg.kafka.transactions:
        raise CsmdError(f"{origin.get(('cluster', 'enabled'), 'defaults')}: [cluster] enabled does not work with "
                        f"[kafka] transactions (each shard commits its own progress, outside any transaction)")
    _check_librdkafka(cfg.kafka, origin)
    return cfg


def label_names(cfg: Config) -> LabelNames:
    """[graph] labels and edge_labels (checked when the config loaded), [graph] directed and time."""
    return LabelNames(cfg.graph.labels, cfg.graph.edge_labels, cfg.graph.directed, cfg.graph.time == "event")


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
MAX_SHARDS = 1000  # a shard is a committed offset in every progress commit and floor read
SESSION_TIMEOUT_MS = (1000, 3_600_000)  # below a second a heartbeat cannot keep a member in its group
MIN_MESSAGE_BYTES = 10_000  # a delta row of a 32-vertex match with long string ids must fit


def _check_together(cfg: Config, origin: dict) -> None:
    """What no single value shows: topic names (valid, and four different topics: a dead-letter
    topic that is the input would feed every refused record back in, forever), batch sizes in
    order, the checkpoint folder not a file."""
    t = cfg.topics
    topics = ("input", "output", "control", "dead_letter")
    names = {key: getattr(t, key) for key in topics}
    if cfg.cluster.enabled:
        _check_cluster(cfg, origin)
        names["cluster group's coordination topic"] = f"{cfg.cluster.group}.shards"
    for key, name in names.items():
        if key in topics and not _TOPIC_NAME.fullmatch(name):
            raise CsmdError(f"{origin.get(('topics', key), 'defaults')}: [topics] {key} must be a Kafka topic name "
                            f"(1 to 249 of A-Z a-z 0-9 . _ -), got {name!r}")
    seen: dict[str, str] = {}
    for key, name in names.items():
        if name in seen:
            raise CsmdError(f"{origin.get(('topics', key), origin.get(('topics', seen[name]), 'defaults'))}: "
                            f"[topics] {seen[name]} and {key} are the same topic {name!r}; each needs its own")
        seen[name] = key
    if t.max_message_bytes < MIN_MESSAGE_BYTES:
        raise CsmdError(f"{origin.get(('topics', 'max_message_bytes'), 'defaults')}: [topics] max_message_bytes must "
                        f"be at least {MIN_MESSAGE_BYTES}, got {t.max_message_bytes}")
    for key in ("carry_headers", "carry_fields"):  # each name is a key of the delta's map: once, not empty
        names = getattr(cfg.output, key)
        if "" in names or len(set(names)) < len(names):
            raise CsmdError(f"{origin.get(('output', key), 'defaults')}: [output] {key} must name each "
                            f"{key[6:-1]} once, none empty, got {names!r}")
    g = cfg.graph
    for key in ("window", "lateness"):
        if getattr(g, key) >= 2**63:
            raise CsmdError(f"{origin.get(('graph', key), 'defaults')}: [graph] {key} must be below 2^63 (ts are int64)")
        if getattr(g, key) and g.time != "event":
            raise CsmdError(f"{origin.get(('graph', key), 'defaults')}: [graph] {key} needs [graph] time = \"event\" "
                            f"(time is {g.time!r}: {origin.get(('graph', 'time'), 'the default')})")
    p = cfg.pipeline
    if p.batch_size > p.max_batch:
        where = origin.get(("pipeline", "batch_size"), origin.get(("pipeline", "max_batch"), "defaults"))
        raise CsmdError(f"{where}: [pipeline] batch_size ({p.batch_size}) must not exceed max_batch ({p.max_batch})")
    ckpt = cfg.checkpoint.dir
    if ckpt and Path(ckpt).exists() and not Path(ckpt).is_dir():
        raise CsmdError(f"{origin.get(('checkpoint', 'dir'), 'defaults')}: [checkpoint] dir {ckpt} is not a folder")


def _check_cluster(cfg: Config, origin: dict) -> None:
    """[cluster] values that Kafka or the client would take and then misbehave on: a group whose
    coordination topic cannot exist (the client aborted the process on an empty one), more shards
    than a group commits in time (the commits timed out and nothing was delivered), a session
    timeout shorter than a heartbeat round trip (both instances kept every shard, each publishing
    everything), and input partitions (the cluster needs one: the update order)."""
    c = cfg.cluster

    def where(section, key):
        return origin.get((section, key), "defaults")

    if not _TOPIC_NAME.fullmatch(f"{c.group}.shards") or not c.group:
        raise CsmdError(f"{where('cluster', 'group')}: [cluster] group must be 1 to 242 of A-Z a-z 0-9 . _ - "
                        f"(its coordination topic is <group>.shards), got {c.group!r}")
    if c.shards > MAX_SHARDS:
        raise CsmdError(f"{where('cluster', 'shards')}: [cluster] shards must be at most {MAX_SHARDS}, got {c.shards}")
    lo, hi = SESSION_TIMEOUT_MS
    if not lo <= c.session_timeout_ms <= hi:
        raise CsmdError(f"{where('cluster', 'session_timeout_ms')}: [cluster] session_timeout_ms must be {lo} to "
                        f"{hi}, got {c.session_timeout_ms}")
    if cfg.topics.partitions != 1:
        raise CsmdError(f"{where('topics', 'partitions')}: [topics] partitions must be 1 with [cluster] enabled "
                        f"(every instance applies the input in one order), got {cfg.topics.partitions}")


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


def _check_librdkafka(kafka: KafkaConfig, origin: dict) -> None:
    """Refuse unknown librdkafka settings, bad values and settings csmd must own, when the config
    loads rather than when the first client is made (each error names where the setting came from).
    Settings that only fail together (sasl.* still missing a password from the environment) are
    reported when the daemon makes its clients."""
    from confluent_kafka import Consumer, KafkaException, Producer

    from csmd.connectors.kafka import FIXED, librdkafka_settings

    quiet = {"log_level": 0, "logger": _Silent()}
    for table, make in (("client", None), ("consumer", Consumer), ("producer", Producer)):
        where = origin.get(("kafka", table), "defaults")
        settings = getattr(kafka, table)
        for key in settings:
            if key in FIXED:
                raise CsmdError(f"{where}: [kafka] {table}: {key!r} is set by {FIXED[key]}, not here")
        for cls in (Consumer, Producer) if make is None else (make,):
            extra = {"group.id": "csmd-config-check"} if cls is Consumer else {}
            try:
                made = cls({**quiet, **extra, **librdkafka_settings(settings)})
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
