"""The layout the search kernels share with their drivers (gpu/layout.cuh), read, never mirrored.

Limits and control slots are the header's #defines, parsed here; struct sizes and field
offsets come from the `layout` kernel the first time a driver needs them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from types import SimpleNamespace

from .module import HERE

_DEFINE = re.compile(r"^#define (\w+) (\d+)\b", re.M)
_D = {name: int(value) for name, value in _DEFINE.findall((HERE / "layout.cuh").read_text())}

MAXQ = _D["MAXQ"]
CTL_POOL, CTL_HEAD, CTL_TAIL, CTL_IDLE = _D["CTL_POOL"], _D["CTL_HEAD"], _D["CTL_TAIL"], _D["CTL_IDLE"]
CTL_STOP, CTL_OUTN, CTL_GCOUNT, CTL_STARTED = _D["CTL_STOP"], _D["CTL_OUTN"], _D["CTL_GCOUNT"], _D["CTL_STARTED"]
STOP_FULL, STOP_LIMIT, STOP_TIME = _D["STOP_FULL"], _D["STOP_LIMIT"], _D["STOP_TIME"]
METHOD_WJ, METHOD_ALLEY = _D["METHOD_WJ"], _D["METHOD_ALLEY"]
TMAXE, TT_EEND, TT_EDGES, TT_ORDERS, TT_WORDS = (_D[k] for k in ("TMAXE", "TT_EEND", "TT_EDGES", "TT_ORDERS", "TT_WORDS"))

# what each module's `layout` kernel writes, in order (bytes)
_FIELDS = {
    "matcher": ("query_table", "qt_outpos", "qt_label", "qt_back", "qt_same", "qt_less", "qt_greater", "level",
                "warp", "warp_active", "warp_batches", "task", "task_q"),
    "sampler": ("sample_plan", "sp_depth", "sp_method", "sp_nfirst", "sp_inherit", "sp_walk", "sp_stream", "sp_ebeg",
                "sp_ej", "sp_same"),
}


@lru_cache(maxsize=None)
def structs(module: str = "matcher") -> SimpleNamespace:
    """Sizes and offsets of a module's kernel structs, in bytes, as the device compiler laid them out."""
    import cupy as cp

    from .module import kernel

    fields = _FIELDS[module]
    out = cp.zeros(len(fields), cp.int64)
    kernel(module, "layout")((1,), (1,), (out,))
    return SimpleNamespace(**dict(zip(fields, out.get().tolist())))
