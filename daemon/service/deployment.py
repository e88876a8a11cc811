"""What the instances of a cluster must agree on, and the check that they do.

Instances that register other queries, start from another initial graph or read or
write other topics do not fail: each matches its shards with what it has, so a shard's
deltas depend on who owns it, and deltas are lost or mixed without a word. So the first
instance of a group writes the deployment (a descriptor: topics, shards, a digest of
the initial graph file, a digest of each query's graph and its output mode) to partition
0 of the coordination topic, and every instance reads the first descriptor there before
it joins: one that differs refuses to start and says what differs. Two instances that
start at once may both write one; the first in the partition is the deployment for
both. The descriptor stays for the life of the group: another configuration is another
deployment, under a new `[cluster] group` (as Kafka Streams asks for a new application.id).
"""

from __future__ import annotations

import hashlib
import json
import socket
import time

import numpy as np
from confluent_kafka import KafkaException, Producer

from csmd.connectors.kafka import KafkaSource, client
from csmd.errors import CsmdError
from csmd.model.formats import parse_query_text
from csmd.service.config import Config, label_names

KEY = b"csmd-deployment"
FIELDS = ("input", "output", "shards", "graph", "queries")  # what must agree; the rest says who wrote it


def describe(cfg: Config, specs, instance: str) -> dict:
    """This instance's deployment: the queries by their parsed graph (a comment or the order of a
    query file's lines changes nothing), the initial graph by its file's bytes."""
    g = cfg.graph
    initial = g.initial
    # how records' ids are read: an instance that takes an id another refuses holds another graph
    kind = "the initial graph's" if initial else "string" if g.ids == "string" else "int"
    return {"input": cfg.topics.input, "output": cfg.topics.output, "shards": cfg.cluster.shards,
            "graph": _file_digest(initial) if initial else "", "ids": f"{kind}, at most {g.max_id_bytes} bytes",
            "direction": "directed" if g.directed else "undirected",
            "time": f"event, window {g.window}, lateness {g.lateness}" if g.time == "event" else "none",
            "queries": {s.name: _query_digest(s.text, s.name, label_names(cfg)) + (" count-only" if s.count_only else "")
                        + (" distinct" if s.distinct else "") for s in specs},
            "instance": instance, "host": socket.gethostname(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def _query_digest(text: str, name: str, labels) -> str:
    q = parse_query_text(text, name, labels)
    h = hashlib.sha256()
    for a in (q.labels, q.indptr, q.indices, q.elabels):
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    h.update("\x00".join(map(str, q.ext_ids.tolist())).encode())
    return h.hexdigest()[:16]


def differences(ours: dict, theirs: dict) -> list[str]:
    """What differs between two deployments, in words (at most a few names of each kind)."""
    out = [f"{k}: {ours[k]!r} here, {theirs.get(k)!r} in the deployment" for k in ("input", "output", "shards")
           if ours[k] != theirs.get(k)]
    if ours["graph"] != theirs.get("graph"):
        out.append("[graph] initial: " + ("another file's content" if ours["graph"] and theirs.get("graph") else
                                          "set here only" if ours["graph"] else "set in the deployment only"))
    if theirs.get("ids", ours["ids"]) != ours["ids"]:  # a deployment written before ids were described has none
        out.append(f"vertex ids: {ours['ids']} here, {theirs['ids']} in the deployment")
    if theirs.get("direction", "undirected") != ours["direction"]:  # one written before directed graphs: undirected
        out.append(f"[graph] directed: {ours['direction']} here, {theirs.get('direction', 'undirected')} in the "
                   f"deployment")
    if theirs.get("time", "none") != ours["time"]:  # one written before event time: none
        out.append(f"[graph] time, window, lateness: {ours['time']} here, {theirs.get('time', 'none')} in the "
                   f"deployment")
    q, t = ours["queries"], theirs.get("queries") or {}
    for what, names in (("queries only here", [n for n in q if n not in t]),
                        ("queries only in the deployment", [n for n in t if n not in q]),
                        ("queries with another graph or output mode", [n for n in q if n in t and q[n] != t[n]])):
        if names:
            out.append(f"{what}: {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}")
    return out


def check(conf: dict, topic: str, group: str, ours: dict, log) -> dict:
    """The group's deployment (writing ours first where there is none); CsmdError if ours differs."""
    first = _first(conf, topic, group, log)
    if first is None:
        producer = client(Producer, {**conf, "enable.idempotence": True, "acks": "all"})
        producer.produce(topic, json.dumps(ours).encode(), KEY, partition=0)
        if producer.flush(30):
            raise CsmdError(f"could not write the deployment to coordination topic {topic!r} within 30 s")
        first = _first(conf, topic, group, log)
        if first is None:
            raise CsmdError(f"coordination topic {topic!r}: the deployment written is not readable back")
        if first == ours:
            log.info("cluster deployment written", topic=topic, queries=len(ours["queries"]))
    diff = differences(ours, first)
    if diff:
        raise CsmdError(f"[cluster] group {group!r} runs another configuration (written by instance "
                        f"{first.get('instance')!r} on {first.get('host')!r} at {first.get('written')}): "
                        f"{'; '.join(diff)}. Every instance of a group must run the same queries, initial graph and "
                        f"topics: start this one with the same, or run the new configuration as a new deployment "
                        f"under another [cluster] group")
    return first


def _first(conf: dict, topic: str, group: str, log) -> dict | None:
    """The first well-formed deployment record in the coordination topic, if any."""
    reader = KafkaSource(conf, topic, f"{group}.deployment")
    try:
        records = reader.read_to_end()
    except KafkaException as exc:
        raise CsmdError(f"coordination topic {topic!r}: cannot read the deployment ({exc})") from None
    finally:
        reader.close()
    for r in (r for r in records if r.partition == 0):
        try:
            found = json.loads(r.value)
            if isinstance(found, dict) and all(k in found for k in FIELDS):
                return found
        except (ValueError, UnicodeDecodeError):
            pass
        log.warning("coordination topic: a record that is not a deployment, skipped", topic=topic,
                    partition=r.partition, offset=r.offset)
    return None
