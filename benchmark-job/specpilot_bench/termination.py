"""The container's termination message: one line saying why it stopped, which the kubelet records in the pod's
status (`containerStatuses[].state.terminated.message`), so the operator can say why a benchmark Job failed
without reading logs. Standard library only: the engine supervisor, which runs in the tenant's engine image,
uses it too.

In a pod the kubelet creates the file (`terminationMessagePath`, default `/dev/termination-log`) before the
container starts; elsewhere it does not exist and nothing is written (a standalone run must not create files
under /dev).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

DEFAULT_PATH = Path("/dev/termination-log")
MAX_BYTES = 4096
"""What the kubelet keeps of one container's message."""


def write_termination_message(path: Path | None, text: str) -> bool:
    """Write `text` (its end, within MAX_BYTES) to the termination message file when that file exists; whether
    it was written."""
    if path is None or not text or not path.is_file():
        return False
    data = text.encode(errors="replace")
    if len(data) > MAX_BYTES:
        data = b"..." + data[-(MAX_BYTES - 3):]
    with contextlib.suppress(OSError):
        path.write_bytes(data)
        return True
    return False
