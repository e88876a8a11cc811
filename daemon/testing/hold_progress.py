"""`csmd` whose cluster members commit no shard progress, for tests that kill instances at a
well-defined point: before any shard's progress moved.

    python -m csmd.testing.hold_progress run --config NAME.toml   (kafka.HOLD_PROGRESS)

A member commits a shard's progress as soon as its re-match is acknowledged (and the consume loop
commits at once when every record is done), so a test that waits for something else (a checkpoint)
and then kills instances "before their progress moved" races those commits: one instance's
re-match can be committed before the other's checkpoint is written. Here the commit is left out
(ClusterMember._commit, which every progress commit goes through), so the group's progress stays
what it was for the life of the process; the rest of the daemon runs unchanged (as
bench/stage_timers.py wraps its stages). A restart with the plain `csmd` commits again.
"""

from __future__ import annotations

import sys

from csmd.cli import main
from csmd.service.cluster import ClusterMember


def _held(_member: ClusterMember, _done: int | None) -> None:
    """Commit nothing: every shard's progress stays where the group has it."""


if not callable(getattr(ClusterMember, "_commit", None)):  # renamed: say so, not a test that races again
    raise SystemExit("csmd.testing.hold_progress: ClusterMember._commit is gone; hold the progress commits "
                     "where they are made now")
ClusterMember._commit = _held

if __name__ == "__main__":
    sys.exit(main())
