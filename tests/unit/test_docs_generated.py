"""The printed outputs README.md and docs/*.md show are what the commands print now (issue 28).

Each is a cog block (scripts/docs_outputs.py runs the real command line); `cog --check` fails when one has
drifted. Regenerate them with `python -m cogapp -r -I scripts README.md docs/demo.md docs/simulate.md docs/profiles.md`.
Slow (the default `specpilot simulate` and `--fleet default` run once each, about a minute together), but not
skipped: scripts/test.sh runs every mark.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import docs_outputs  # noqa: E402


@pytest.mark.slow
def test_generated_blocks_match_what_the_commands_print(capsys):
    code = docs_outputs.main(["--check"])
    captured = capsys.readouterr()
    assert code == 0, (
        "a generated block of the docs no longer matches its command's output; regenerate with "
        f"`python -m cogapp -r -I scripts {' '.join(docs_outputs.GENERATED)}` and commit:\n"
        + captured.out + captured.err)


def test_every_file_with_cog_markers_is_checked():
    marked = {path.relative_to(REPO).as_posix() for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]
              if "[[[cog" in path.read_text()}
    assert marked == set(docs_outputs.GENERATED)


def test_the_known_blocks_are_where_the_docs_say():
    """Each output the docs show is still generated, in the file that now holds it (the demo's options moved
    from the README to docs/demo.md with the rest of the demo's page)."""
    expected = {
        "README.md": ['shown("specpilot plan --profile examples/speculationprofile-h100-baseline.yaml'],
        "docs/demo.md": ['shown("specpilot demo --help")'],
        "docs/simulate.md": ['shown("specpilot simulate", in_repo=False)',
                             'shown("specpilot simulate --fleet default", in_repo=False)',
                             'fleet_table("--fleet", "all", "--fast")'],
        "docs/profiles.md": ["refine_example()"],
    }
    for name, calls in expected.items():
        code = "\n".join(re.findall(r"<!-- \[\[\[cog\n(.*?)\]\]\] -->", (REPO / name).read_text(), flags=re.S))
        for call in calls:
            assert call in code, f"{name}: no generated block calls {call}"


def test_generated_text_has_no_host_dependent_wall_time():
    shown = docs_outputs.WALL_TIME.sub(docs_outputs.WALL_TIME_SHOWN, "fixed policy  (23.4 s)\nfleet  (61 s)")
    assert shown == f"fixed policy  {docs_outputs.WALL_TIME_SHOWN}\nfleet  {docs_outputs.WALL_TIME_SHOWN}"
    for name in docs_outputs.GENERATED:
        text = (REPO / name).read_text()
        for generated in re.findall(r"\]\]\] -->\n(.*?)<!-- \[\[\[end\]\]\]", text, flags=re.S):
            assert not docs_outputs.WALL_TIME.search(generated), f"{name}: a wall time in a generated block"
            assert not re.search(r"[ \t]$", generated, flags=re.M), f"{name}: trailing whitespace"
