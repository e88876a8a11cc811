"""The compiled engine's first-use cost: one csmd command in a fresh process, numba cache empty, then warm."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time


def first_use(csmd_args: list[str]) -> tuple[float, float]:
    """Wall seconds of `csmd <csmd_args>` with an empty numba cache (it compiles), then with it warm."""
    cmd = [sys.executable, "-m", "csmd", *csmd_args]
    out = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):
            t0 = time.monotonic()
            subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "NUMBA_CACHE_DIR": cache})
            out.append(time.monotonic() - t0)
    return out[0], out[1]
