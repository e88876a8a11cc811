"""The CUDA sources of this package, compiled once per process with cupy.RawModule (loaded once
per device: a daemon that drives several GPUs launches each kernel on each of them).

CuPy also keeps compiled binaries in its on-disk kernel cache, keyed by the source
text: local headers are pasted into the source so that editing one invalidates it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPTIONS = ("-std=c++17",)
_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.M)


def source(name: str) -> str:
    """gpu/<name>.cu with its local #include "..." lines replaced by the headers' text,
    recursively, each header once (NVRTC is given no include path)."""
    pasted: set[str] = set()

    def paste(m):
        header = m.group(1)
        if header in pasted:
            return ""
        pasted.add(header)
        return _INCLUDE.sub(paste, (HERE / header).read_text().replace("#pragma once\n", ""))

    return _INCLUDE.sub(paste, (HERE / f"{name}.cu").read_text())


@lru_cache(maxsize=None)
def _module(name: str, device: int):
    import cupy

    return cupy.RawModule(code=source(name), options=OPTIONS)


def module(name: str):
    """The compiled module of gpu/<name>.cu on the current device."""
    import cupy

    return _module(name, cupy.cuda.Device().id)


def kernel(name: str, function: str):
    """A kernel of gpu/<name>.cu on the current device."""
    return module(name).get_function(function)
