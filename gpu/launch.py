"""Launch shapes and kernel-argument helpers shared by the drivers."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor, wait

import cupy as cp
import numpy as np

THREADS = 256


def flat_grid(n: int) -> tuple[int]:
    """Blocks for a grid-stride loop over n items: enough to fill the device, no more."""
    return (max(1, min(-(-n // THREADS), _sms(cp.cuda.Device().id) * 8)),)


@functools.cache
def _sms(device: int) -> int:
    """The device's multiprocessors (CuPy reads every attribute at once: some 100 us)."""
    return cp.cuda.Device(device).attributes["MultiProcessorCount"]


@functools.cache
def _device_threads() -> ThreadPoolExecutor:
    """The threads on_each_device runs the devices after the first on, made on first use."""
    return ThreadPoolExecutor(thread_name_prefix="csmd-gpu")


def on_each_device(devices: list[int], fn) -> list:
    """[fn(i) for each device i of `devices`], each call under its device (CuPy's current device is
    per thread): the first on the caller's thread, the others at once on threads of their own.
    Returns when every call has ended, so that no device is left working when an error (the
    first device's before the others') is raised."""
    others = [_device_threads().submit(_under, d, fn, i) for i, d in enumerate(devices[1:], 1)]
    try:
        first = _under(devices[0], fn, 0)
    finally:
        wait(others)
    return [first] + [f.result() for f in others]


def _under(device: int, fn, i: int):
    with cp.cuda.Device(device):
        return fn(i)


def i64(x) -> np.int64:
    return np.int64(x)


def i32(x) -> np.int32:
    return np.int32(x)


def u64(x) -> np.uint64:
    return np.uint64(x)


_DUMMY: dict[int, cp.ndarray] = {}  # per device


def or_dummy(a: cp.ndarray | None) -> cp.ndarray:
    """A stand-in for an absent array (the kernel never reads it)."""
    if a is not None:
        return a
    device = cp.cuda.Device().id
    if device not in _DUMMY:
        _DUMMY[device] = cp.zeros(1, cp.int32)
    return _DUMMY[device]


class DirectLaunch:
    """A hot kernel launched through cuLaunchKernel with its arguments in one host buffer.

    CuPy's call converts every argument again on each launch: 16 us for the 17 of
    gu_small_apply on the device host, against 4 us here, a large share of a batch of one's
    host time. Every parameter takes one 8-byte slot (a 4-byte int reads the slot's low half:
    the host is little-endian) except a leading struct passed by value (MVGView), which takes
    its size in words; arguments are Python ints (pointers as ints: `array.data.ptr`). The
    driver copies the values at the launch, so the buffer is free again when it returns.
    """

    def __init__(self, fn, params: int, struct_words: int = 0):
        """fn: a RawKernel; params: its parameters after the struct (struct_words 0: none)."""
        from cupy.cuda import driver

        self._launch, self._f = driver.launchKernel, fn.kernel.ptr
        self._lead, self._n = struct_words, params
        self._words = np.zeros(struct_words + params, np.int64)
        starts = [0] * bool(struct_words) + list(range(struct_words, struct_words + params))
        self._ptrs = np.array([self._words.ctypes.data + 8 * s for s in starts], np.uint64)
        self._pp = self._ptrs.ctypes.data

    def __call__(self, grid: int, block: int, stream_ptr: int, args, struct: np.ndarray | None = None,
                 shared_mem: int = 0) -> None:
        """Launch on the stream with `args` (self._n ints) after `struct` (its int64 words; None:
        the last launch's)."""
        if len(args) != self._n:
            raise TypeError(f"{self._n} arguments expected, {len(args)} given")
        if struct is not None:
            self._words[: self._lead] = struct
        self._words[self._lead:] = args
        self._launch(self._f, grid, 1, 1, block, 1, 1, shared_mem, stream_ptr, self._pp, 0)
