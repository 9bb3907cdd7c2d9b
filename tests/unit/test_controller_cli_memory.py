"""The operator's memory diagnostics (controller.cli, issue 27): off unless SPECPILOT_TRACEMALLOC asks, and a
dump that names allocation sites and the allocators' own figures."""

from __future__ import annotations

import io
import tracemalloc

from specpilot.controller import cli


def test_tracemalloc_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(cli.TRACEMALLOC_ENV, raising=False)
    assert cli.enable_tracemalloc() is False
    assert cli.enable_tracemalloc("0") is False
    assert not tracemalloc.is_tracing()


def test_a_dump_names_the_sites_that_hold_memory():
    out = io.StringIO()
    cli.dump_tracemalloc(out)  # not tracing: the allocators' figures only
    assert out.getvalue().startswith("allocators:")
    out = io.StringIO()
    tracemalloc.start(2)
    try:
        held = [bytearray(64 * 1024) for _ in range(16)]  # noqa: F841 (held while the dump runs)
        cli.dump_tracemalloc(out, top=5)
    finally:
        tracemalloc.stop()
    text = out.getvalue()
    assert text.startswith("tracemalloc: traced")
    assert "test_controller_cli_memory.py" in text  # the list above is the largest site
    assert "by traceback" in text  # more than one frame kept
    assert "allocators:" in text
