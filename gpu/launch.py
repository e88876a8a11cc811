"""Launch shapes and kernel-argument helpers shared by the drivers."""

from __future__ import annotations

import cupy as cp
import numpy as np

THREADS = 256


def flat_grid(n: int) -> tuple[int]:
    """Blocks for a grid-stride loop over n items: enough to fill the device, no more."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    return (max(1, min(-(-n // THREADS), sms * 8)),)


def i64(x) -> np.int64:
    return np.int64(x)


def i32(x) -> np.int32:
    return np.int32(x)


def u64(x) -> np.uint64:
    return np.uint64(x)


_DUMMY: dict[str, cp.ndarray] = {}


def or_dummy(a: cp.ndarray | None) -> cp.ndarray:
    """A stand-in for an absent array (the kernel never reads it)."""
    if a is not None:
        return a
    if "int32" not in _DUMMY:
        _DUMMY["int32"] = cp.zeros(1, cp.int32)
    return _DUMMY["int32"]
