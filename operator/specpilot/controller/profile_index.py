"""The SpeculationProfiles index, kept compact.

kopf's index keeps, for every profile of the watched namespaces, what the index handler returned, for as long
as the profile exists. A Succeeded profile's status holds every measured point of every run (per level:
throughputs, four latency distributions, the engine's counters, per-position acceptance): about 15 KB of JSON,
which as Python dicts, lists and floats takes about 45 KB. At 200 deployments (733 profiles in
benchmarks/operator_scale.py) that was about 30 MiB of the operator's memory, for data a reconciliation reads
only for the few profiles of the deployment it reconciles.

The content cannot be cut to what the decisions read: the result's seal (api.seal) covers the whole result and
is checked against it, and the plausibility checks read it too. So each entry is kept whole but packed: the
value as `marshal` writes it, compressed with zlib (about 3 KB a profile), and unpacked when a reconciliation
looks the profile up (about 50 us; the planner's validation of the same body costs more). The unpacked value is
equal to what was packed (marshal round-trips dicts, lists, strings, numbers, booleans and None exactly, key
order included), so every reader sees what it saw before.

`marshal` reads only bytes this process wrote a moment before (never anything received), so its format being
private to the Python version is no concern.
"""

from __future__ import annotations

import marshal
import zlib
from typing import Any

LEVEL = 1
"""zlib's level: 1 compresses a profile to about a quarter of its marshalled size (6 gains 10% more for twice
the time), and the index handler runs for every watch event of every profile."""


class Packed:
    """One packed index entry; `unpack()` returns a fresh copy of the value each time."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def unpack(self) -> Any:
        return marshal.loads(zlib.decompress(self.data))

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Packed({len(self.data)} bytes)"


def pack(value: Any) -> Packed | Any:
    """`value` (JSON-like: dicts, lists, strings, numbers, booleans, None, as a watch event's body is) packed;
    a value marshal cannot write (no watch event holds one) is kept as it is, so the profile stays indexed."""
    try:
        return Packed(zlib.compress(marshal.dumps(value), LEVEL))
    except ValueError:
        return value



NOT_INDEXED = "specpilot.io/not-indexed"
"""The key of what an index keeps in place of an entry too large to keep: the reader gets the object itself from
the API server instead (an index grows with what a tenant may write into its objects; this bounds it)."""
MAX_ENTRY_BYTES = 64 * 1024
"""The largest packed entry an index keeps (a serving Deployment packs to about 1.5 KB)."""


def bounded(value: Any, max_bytes: int = MAX_ENTRY_BYTES) -> Packed | dict:
    """`value` packed, or the NOT_INDEXED marker when it packs to more than `max_bytes`."""
    packed = pack(value)
    if not isinstance(packed, Packed) or len(packed) > max_bytes:
        return {NOT_INDEXED: True}
    return packed
