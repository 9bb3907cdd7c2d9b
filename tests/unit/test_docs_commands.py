"""Every offline `specpilot plan` / `specpilot validate` line README.md and docs/*.md show runs (issue 28).

Collected: the lines of fenced code blocks that start with `specpilot plan` or `specpilot validate` (after an
optional `$ ` prompt or `.venv/bin/`; backslash-continued lines joined), and inline code spans that start with
`specpilot plan ` or `specpilot validate `. A command whose files are all in the repository runs in-process
through the console script's entry point (`specpilot.cli:main`) from the repository root and must exit 0 and
print something. A command that names a file the repository does not hold is a reader's own (`profiles.yaml`)
or a usage line (`FILE...`): its names must be in PLACEHOLDERS, so a mistyped example path fails here, and
the options it names must be ones the subcommand has. The printed outputs of the cog blocks are checked by
test_docs_generated.py; their command lines run here again too (a second or so).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from docs_lines import fenced_lines
from specpilot.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SUBCOMMANDS = ("plan", "validate")
FENCED = re.compile(r"(?:\$\s+)?(?:\.venv/bin/)?(specpilot\s+(?:plan|validate)\b.*)")
INLINE = re.compile(r"(?:\.venv/bin/)?(specpilot (?:plan|validate) .*)", re.S)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
PATH_SUFFIXES = (".yaml", ".yml", ".json", ".csv")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1"}

# Names the docs use for a file the repository does not (and should not) hold: usage-line metavariables and
# the reader's own files. A command naming one is shown, not run. Anything else that looks like a path and is
# missing is a docs bug (a renamed or mistyped example), and fails.
PLACEHOLDERS = {
    "FILE": "usage metavariable (`specpilot validate FILE`)",
    "FILE...": "usage metavariable, one or more files (`specpilot plan --profile FILE...`)",
    "...": "elided arguments (`specpilot plan --profile ...` on a pool's profiles)",
    "profiles.yaml": "what the reader's own `specpilot-bench --output profiles.yaml` wrote (docs/benchmark-job.md)",
    "values.yaml": "the cluster admin's chart values file, given to --operator-config",
}


def _code_spans(path: Path) -> list[tuple[int, str]]:
    """(line, content) of each inline code span outside fenced blocks and HTML comments (cog's markers); a span
    may continue onto the next line of its paragraph, as in CommonMark."""
    spans = []
    paragraph: list[tuple[int, str]] = []

    def flush() -> None:
        if paragraph:
            first = paragraph[0][0]
            text = "\n".join(line for _, line in paragraph)
            for match in CODE_SPAN.finditer(text):
                spans.append((first + text.count("\n", 0, match.start()), match.group(2).replace("\n", " ").strip()))
            paragraph.clear()

    in_block = in_comment = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if in_comment:
            in_comment = "-->" not in stripped
            continue
        if stripped.startswith("```"):
            flush()
            in_block = not in_block
            continue
        if in_block:
            continue
        if stripped.startswith("<!--"):
            flush()
            in_comment = "-->" not in stripped
            continue
        if not stripped:
            flush()
            continue
        paragraph.append((number, line))
    flush()
    return spans


def documented_commands() -> list[tuple[str, str]]:
    """("file:line", command) for each `specpilot plan|validate` line the docs show, in file order."""
    found = []
    for path in DOCS:
        name = path.relative_to(REPO).as_posix()
        for start, text in fenced_lines(path):
            if match := FENCED.fullmatch(text):
                found.append((start, f"{name}:{start}", match.group(1)))
        for number, content in _code_spans(path):
            if match := INLINE.fullmatch(content):
                found.append((number, f"{name}:{number}", match.group(1)))
    return [(where, command) for _, where, command in sorted(found, key=lambda f: (f[1].split(":")[0], f[0]))]


def argv_of(command: str) -> list[str]:
    """The arguments after `specpilot`, up to a shell operator (a pipe or redirection), brackets of optional
    parts removed."""
    argv = []
    for token in shlex.split(command, comments=True)[1:]:
        if token in SHELL_OPERATORS or token.startswith((">", "2>")):
            break
        argv.append(token.strip("[]") if token not in ("[", "]") else "")
    return [token for token in argv if token]


def missing_names(argv: list[str]) -> list[str]:
    """The arguments that name a file or directory the repository lacks, or stand for one (FILE, ...)."""
    missing = []
    for token in argv[1:]:
        if token.startswith("-"):
            _, has_value, token = token.partition("=")
            if not has_value:
                continue
        if "://" in token:
            continue
        if "..." in token or re.fullmatch(r"[A-Z][A-Z_]*", token):
            missing.append(token)
        elif ("/" in token or token.endswith(PATH_SUFFIXES)) and not (REPO / token).exists():
            missing.append(token)
    return missing


COMMANDS = documented_commands()


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refusing the line
        return exc.code if isinstance(exc.code, int) else 1


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_runs(where, command, monkeypatch, capsys):
    argv = argv_of(command)
    assert argv and argv[0] in SUBCOMMANDS, f"{where}: {command!r}"
    missing = missing_names(argv)
    if missing:
        unknown = [name for name in missing if name not in PLACEHOLDERS]
        assert not unknown, (
            f"{where}: `{command}` names {unknown}, which the repository does not hold; fix the path in the docs "
            f"(or, for a reader's own file or a usage placeholder, add it to PLACEHOLDERS with why)")
        # not runnable, but its options must still be the subcommand's
        assert run([argv[0], "--help"]) == 0
        usage = capsys.readouterr().out
        for option in {token.partition("=")[0] for token in argv[1:] if token.startswith("--")}:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", usage), (
                f"{where}: `{command}`: `specpilot {argv[0]}` has no option {option}")
        return
    monkeypatch.chdir(REPO)
    code = run(argv)
    captured = capsys.readouterr()
    assert code == 0, f"{where}: `{command}` exited {code}:\n{captured.out}{captured.err}"
    assert (captured.out + captured.err).strip(), f"{where}: `{command}` printed nothing"


def test_the_collector_finds_the_known_commands():
    base, eagle3 = "examples/speculationprofile-h100-baseline.yaml", "examples/speculationprofile-h100-eagle3.yaml"
    found = {(where.split(":")[0], command) for where, command in COMMANDS}
    for known in [
        ("README.md", "specpilot validate examples/"),
        ("README.md", "specpilot validate FILE..."),
        ("README.md", f"specpilot plan --profile {base} {eagle3} --slo-tpot-ms 20 --price-per-gpu-hour 2.5 "
                      "--min-gain 5"),
        ("docs/profiles.md", f"specpilot plan --profile {base} {eagle3} --slo-tpot-ms 40 --min-gain 5"),
        ("docs/profiles.md", f"specpilot plan --profile {base} {eagle3} --concurrency-histogram "
                             "examples/concurrency-histogram.csv --objective cost -o json"),
        ("docs/profiles.md", f"specpilot validate {base}"),
        ("docs/benchmark-job.md", "specpilot plan --profile profiles.yaml"),
    ]:
        assert known in found, f"the collector missed {known}; it found {sorted(found)}"
    runnable = [where for where, command in COMMANDS if not missing_names(argv_of(command))]
    assert len(runnable) >= 5, runnable


def test_every_placeholder_is_still_used():
    used = {name for _, command in COMMANDS for name in missing_names(argv_of(command))}
    assert set(PLACEHOLDERS) <= used, f"no documented command uses {set(PLACEHOLDERS) - used}: drop it"


def test_a_mistyped_example_path_is_not_a_placeholder():
    argv = argv_of("specpilot validate examples/speculationprofile-h100-baselin.yaml")
    assert missing_names(argv) == ["examples/speculationprofile-h100-baselin.yaml"]
    assert not set(missing_names(argv)) & set(PLACEHOLDERS)
    assert argv_of("specpilot validate [--operator-config values.yaml] FILE... | head") == [
        "validate", "--operator-config", "values.yaml", "FILE..."]


def _commands_table() -> list[str]:
    """The first cell's code of each row of the README's `## Commands` table."""
    text = (REPO / "README.md").read_text()
    assert "\n## Commands\n" in text, "README has no Commands section"
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [match.group(1) for line in section.splitlines()
            if (match := re.match(r"\|\s*`([^`]+)`\s*\|", line))]


def test_the_readme_commands_table_names_real_commands(capsys):
    """Each row of the README's Commands table is a console script of the distribution, and each `specpilot`
    row a subcommand (its --help runs) or, for `specpilot --version`, a flag that prints the version."""
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    rows = _commands_table()
    assert "specpilot --version" in rows and "specpilot run" in rows, rows
    for row in rows:
        argv = shlex.split(row)
        assert argv[0] in scripts, f"README Commands: `{row}`: {argv[0]} is not a console script ({sorted(scripts)})"
        if argv[0] != "specpilot":
            continue
        if argv[1:] == ["--version"]:
            assert run(["--version"]) == 0
            out = capsys.readouterr().out
            assert re.fullmatch(r"specpilot \S+\n", out), f"`specpilot --version` printed {out!r}"
            continue
        assert run([argv[1], "--help"]) == 0, f"README Commands: `{row}`: no subcommand {argv[1]}"
        usage = capsys.readouterr().out
        for option in {token.strip("[]") for token in argv[2:] if token.strip("[]").startswith("--")}:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", usage), (
                f"README Commands: `{row}`: `specpilot {argv[1]}` has no option {option}")

