"""Checks shared by the real-engine profile tests: the shape every speculative run of a profile has.

The tiny models' weights make acceptance meaningless as a number, so only its mechanics are checked
(counters parsed, non-increasing per position, accepted <= drafted), never a speed.
"""

from __future__ import annotations

LEVELS = (1, 2)
REQUESTS_PER_LEVEL = 3


def requests_at(concurrency: int, requests_per_level: int = REQUESTS_PER_LEVEL) -> int:
    """The requests a level sends: --requests-per-level, raised to two waves of the level's concurrency
    (specpilot_bench.cli.MIN_WAVES)."""
    from specpilot_bench.cli import MIN_WAVES

    return max(requests_per_level, MIN_WAVES * concurrency)


def check_speculative_run(run: dict, k: int, levels: tuple[int, ...] = LEVELS,
                          requests_per_level: int = REQUESTS_PER_LEVEL) -> None:
    """A run at K=k: every level completed, drafted and accepted; per-position counters of length k that fall
    with the position and add up to the accepted tokens; the run's acceptance summary consistent with them."""
    assert run["numSpeculativeTokens"] == k
    assert [p["concurrency"] for p in run["points"]] == list(levels)
    for point in run["points"]:
        assert point["completed"] == requests_at(point["concurrency"], requests_per_level) and point["failed"] == 0
        assert point["numDrafts"] > 0 and point["numDraftTokens"] > 0 and point["numAcceptedTokens"] > 0
        assert point["numAcceptedTokens"] <= point["numDraftTokens"]
        per_position = point["acceptedPerPosition"]
        assert len(per_position) == k
        assert per_position == sorted(per_position, reverse=True)
        assert sum(per_position) == point["numAcceptedTokens"]
    acceptance = run["acceptance"]
    assert len(acceptance["perPosition"]) == k
    assert acceptance["perPosition"] == sorted(acceptance["perPosition"], reverse=True)
    assert 0 < acceptance["draftsPerStep"] <= 1
    assert 1 < acceptance["meanAcceptanceLength"] <= 1 + k
