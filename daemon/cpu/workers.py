"""Threads for the compiled CPU engine: the kernels release the GIL, so a static query's root
candidates are split into contiguous chunks that a thread pool searches at once (results
put together in chunk order, so they do not depend on the thread count), and a batch's
search (continuous) runs as one task per thread of the pool (compiled.py).

The thread count is CSMD_THREADS, else the machine's cores.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from csmd.errors import CsmdError

CHUNKS_PER_THREAD = 4  # more chunks than threads: a chunk with a deep search does not hold the rest back
_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def thread_count() -> int:
    """CSMD_THREADS (a positive integer), else the cores this process may run on."""
    text = os.environ.get("CSMD_THREADS", "").strip()
    if not text:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise CsmdError(f"CSMD_THREADS: expected a positive integer, got {text!r}")
    return int(text)


def chunks(n: int, threads: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering range(n) in order: one for a single thread, else up to
    CHUNKS_PER_THREAD per thread."""
    k = max(1, min(n, 1 if threads == 1 else threads * CHUNKS_PER_THREAD))
    cuts = [n * i // k for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def run_chunks(fn, ranges: list[tuple[int, int]], threads: int) -> list:
    """[fn(lo, hi) for each range], run on `threads` threads (a shared pool per count)."""
    return start_tasks([functools.partial(fn, lo, hi) for lo, hi in ranges], threads)()


def start_tasks(tasks: list, threads: int, done=lambda: None):
    """[task() for each task] without the wait: the tasks start on the shared pool, behind those
    started before, and the function returned waits for their list; on one thread (or for one
    task) they run here and now. done() is called once every task has run (or raised), on the
    thread of the last one."""
    if threads == 1 or len(tasks) == 1:
        try:
            out = [task() for task in tasks]
        finally:
            done()
        return lambda: out
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="csmd-cpu")
    left, counting = [len(tasks)], threading.Lock()

    def one_done(_future) -> None:
        with counting:
            left[0] -= 1
            last = not left[0]
        if last:
            done()

    futures = [pool.submit(task) for task in tasks]
    for f in futures:
        f.add_done_callback(one_done)
    return lambda: [f.result() for f in futures]
