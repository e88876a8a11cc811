"""Label names: words that stand for vertex and edge labels wherever a label is read.

A fraud team thinks in `account`, `device` and `card`, not 0, 1 and 2: with
`[graph] labels = { account = 0, device = 1, card = 2 }` (and `edge_labels`
likewise), or `--labels FILE` on the command line, graph, query and update text
may say `v 7 account` and `e 7 8 transfer`, and JSON and Arrow records
`"label": "account"`. Numbers keep their meaning; the graph stores numbers, so
outputs hold numbers too.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from csmd.errors import CsmdError

MAX_LABEL = 2**31 - 1
_NAME = re.compile(r"[^\s#][^\s]*")  # one token of a text line that is not a comment
_NUMBER = re.compile(r"[-+]?[0-9]+")
_SHOWN = 12  # names listed in an error at most


@dataclass(frozen=True)
class LabelNames:
    """Name -> label, for vertices and for edges (empty: numbers only); with how a deployment
    reads graph text: `directed`, its edges are arcs ([graph] directed, --directed), so that a
    query sent to it is read as its graph is; `timed`, its edges have event times, so that a query
    may hold time constraints (model/time_constraints.py)."""

    vertex: dict = field(default_factory=dict)
    edge: dict = field(default_factory=dict)
    directed: bool = False
    timed: bool = False

    @staticmethod
    def from_tables(vertex: dict, edge: dict, where: str, section: str = "") -> "LabelNames":
        """Checked tables; CsmdError naming `where` and the table (in `section`) otherwise. A name
        is one token that is not a number (it would hide that label); a label has one name (two
        are a typo more often than a synonym)."""
        for key, table in ((f"{section}labels", vertex), (f"{section}edge_labels", edge)):
            if not isinstance(table, dict):
                raise CsmdError(f"{where}: {key} must be a table of name = label, got {table!r}")
            given: dict[int, str] = {}
            for name, label in table.items():
                if not _NAME.fullmatch(name) or _NUMBER.fullmatch(name):
                    raise CsmdError(f"{where}: {key}: name {name!r} must be one word without spaces, not a number "
                                    f"and not starting with #")
                if type(label) is not int or not 0 <= label <= MAX_LABEL:
                    raise CsmdError(f"{where}: {key}: {name} must be a label number in 0 .. 2^31-1, got {label!r}")
                if label in given:
                    raise CsmdError(f"{where}: {key}: {given[label]} and {name} both name label {label}")
                given[label] = name
        return LabelNames(dict(vertex), dict(edge))

    @staticmethod
    def load(path) -> "LabelNames":
        """The names of a TOML file: tables `labels` and `edge_labels`, at its top or in its [graph]
        table (so a daemon config serves as well)."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CsmdError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise CsmdError(f"{path}: not valid TOML: {exc}") from None
        if isinstance(data.get("graph"), dict):
            data = data["graph"]
        else:
            other = sorted(set(data) - {"labels", "edge_labels"})
            if other:
                raise CsmdError(f"{path}: unknown key(s) {', '.join(other)} (expected labels and edge_labels tables)")
        return LabelNames.from_tables(data.get("labels", {}), data.get("edge_labels", {}), str(path))


NO_NAMES = LabelNames()


def unknown_label(name: str, names: dict, what: str) -> str:
    """The reason for a label name that `names` lacks (what: "vertex label" or "edge label")."""
    if not names:
        return f"{what} {name!r} is not a number, and no {what} names are defined ([graph] " \
               f"{'edge_labels' if what.startswith('edge') else 'labels'}, or --labels)"
    close = difflib.get_close_matches(name, list(names), 1)
    known = sorted(names, key=names.get)
    return (f"unknown {what} {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") +
            f"; names: {', '.join(known[:_SHOWN])}{', ...' if len(known) > _SHOWN else ''}")
