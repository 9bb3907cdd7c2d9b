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

    class Held:  # a type the collector tracks, held 5,000 times while the dump runs
        pass

    held_objects = [Held() for _ in range(5000)]
    out = io.StringIO()
    cli.dump_tracemalloc(out)  # which kinds of object the live heap is made of, by size and by count
    assert "gc runs and seconds by generation: gen0" in out.getvalue()  # how much CPU the collector took
    by_count = out.getvalue().split("types by count:")[1]
    assert any(line.split()[-1].endswith("Held") and int(line.split()[2]) >= 5000 for line in by_count.splitlines()[1:])
    del held_objects
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


def test_free_heap_pages_are_handed_back_periodically(monkeypatch):
    import threading

    trimmed = threading.Event()

    class Trim:
        argtypes = restype = None

        def __call__(self, pad):
            assert pad == 0
            trimmed.set()
            return 1

    class Libc:
        malloc_trim = Trim()

    monkeypatch.setattr(cli.ctypes, "CDLL", lambda name: Libc())
    stop = cli.start_malloc_trim(every_s=0.01)
    try:
        assert trimmed.wait(30)
    finally:
        stop.set()


def test_no_trim_where_the_c_library_is_not_glibc(monkeypatch):
    def refuse(name):
        raise OSError(name)

    monkeypatch.setattr(cli.ctypes, "CDLL", refuse)
    assert cli.start_malloc_trim() is None


def test_the_collector_is_tuned_at_start_and_a_bad_setting_is_named(monkeypatch):
    """The operator freezes what start-up made and lets short-lived objects die young (cli.GC_THRESHOLDS);
    SPECPILOT_GC_THRESHOLDS overrides, and a value that is not integers stops start-up with the fix."""
    import gc

    import pytest

    before = gc.get_threshold()
    try:
        monkeypatch.delenv(cli.GC_THRESHOLDS_ENV, raising=False)
        assert cli.tune_collector() == cli.GC_THRESHOLDS == gc.get_threshold()
        assert gc.get_freeze_count() > 0
        monkeypatch.setenv(cli.GC_THRESHOLDS_ENV, "700,10,10")
        assert cli.tune_collector() == (700, 10, 10) == gc.get_threshold()
        for hostile in ("fast", "-1", "1,2,3,4", "9" * 30, "50000,,10", "--50000", "50000\n20"):
            with pytest.raises(SystemExit, match=cli.GC_THRESHOLDS_ENV + ".*one to three integers"):
                cli.tune_collector(hostile)
            assert gc.get_threshold() == (700, 10, 10)  # refused before anything was set
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
