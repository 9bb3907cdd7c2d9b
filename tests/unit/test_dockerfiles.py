"""The two images: their Dockerfiles build from the repository root, and the README builds and names them as
the chart expects.

- Every COPY/ADD source of `Dockerfile` (the operator) and `benchmark-job/Dockerfile` (the benchmark Job)
  exists relative to the repository root, the build context both use, and no `.dockerignore` drops it.
- The README's `docker build` lines name files that exist: the `-f` Dockerfile (default `Dockerfile` in the
  context) and the context, which is the repository root; each line is the one its Dockerfile's header
  comment gives (same `-f`, tag and context).
- The tags they build are the chart's defaults (`image.repository`:`image.tag`, empty tag meaning the chart's
  appVersion, for the operator; `config.benchmarkImage` for the benchmark Job), each from its own Dockerfile.
- The README's retag/push/helm lines are consistent: `docker tag` starts from a built image, every pushed image
  was tagged, and the helm line's `--set image.repository`/`image.tag`/`config.benchmarkImage` name the pushed
  images, operator and benchmark each in its own key.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from docs_lines import fenced_lines

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CHART = REPO / "charts" / "specpilot"
OPERATOR_DOCKERFILE = "Dockerfile"
BENCH_DOCKERFILE = "benchmark-job/Dockerfile"
DOCKERFILES = (OPERATOR_DOCKERFILE, BENCH_DOCKERFILE)


# ----- parsing ---------------------------------------------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments and blank lines dropped."""
    result, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        name, _, args = text.partition(" ")
        result.append((name.upper(), args.strip()))
    assert not pending, f"{dockerfile}: an instruction continues past the end of the file"
    return result


def copy_sources(dockerfile: Path) -> list[str]:
    """The build-context sources of every COPY/ADD (those of `--from=` another stage or image excluded)."""
    sources = []
    for name, args in instructions(dockerfile):
        if name not in ("COPY", "ADD"):
            continue
        if args.startswith("["):
            tokens = json.loads(args)
        else:
            tokens = shlex.split(args)
        flags = [t for t in tokens if t.startswith("--")]
        paths = [t for t in tokens if not t.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        assert len(paths) >= 2, f"{dockerfile}: {name} {args}: no source"
        sources += paths[:-1]
    return sources


def header_build_lines(dockerfile: Path) -> list[str]:
    """The `docker build ...` commands the Dockerfile's comments give."""
    lines = []
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"#.*?(docker build .*)$", line.strip())
        if match:
            lines.append(match.group(1).strip())
    return lines


def docker_build(command: str) -> dict[str, str]:
    """-f (default: Dockerfile in the context), the tag and the context of a `docker build` line."""
    tokens = shlex.split(command)
    assert tokens[:2] == ["docker", "build"], command
    file, tags, positional = None, [], []
    i = 2
    while i < len(tokens):
        token = tokens[i]
        name, has_value, value = token.partition("=")
        if name in ("-f", "--file", "-t", "--tag"):
            if not has_value:
                i += 1
                value = tokens[i]
            if name in ("-f", "--file"):
                file = value
            else:
                tags.append(value)
        elif token.startswith("-"):
            raise AssertionError(f"`{command}`: a flag this test does not know ({token}): teach it")
        else:
            positional.append(token)
        i += 1
    assert len(positional) == 1, f"`{command}`: expected one build context, got {positional}"
    assert len(tags) == 1, f"`{command}`: expected one -t, got {tags}"
    context = positional[0]
    file = file if file is not None else str(Path(context) / "Dockerfile")
    return {"file": Path(file).as_posix(), "tag": tags[0], "context": context}


def readme_commands(prefix: str) -> list[str]:
    """The README's fenced command lines that start with `prefix` (continuation lines joined)."""
    return [text for _, text in fenced_lines(README) if text.startswith(prefix)]


def readme_section(title: str) -> str:
    """The text under the README's heading `title` (## or ###), up to the next heading of either level."""
    match = re.search(rf"^#{{2,3}} {re.escape(title)}\n(.*?)(?=^#{{2,3}} |\Z)", README.read_text(), flags=re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def chart_defaults() -> dict[str, str]:
    """Dockerfile -> the image the chart runs from it by default."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
    operator = f"{values['image']['repository']}:{values['image']['tag'] or app_version}"
    return {OPERATOR_DOCKERFILE: operator, BENCH_DOCKERFILE: values["config"]["benchmarkImage"]}


def split_image(reference: str) -> tuple[str, str]:
    """(repository, tag) of an image reference with a tag."""
    repository, _, tag = reference.rpartition(":")
    assert repository and "/" not in tag, f"{reference}: expected repository:tag"
    return repository, tag


# ----- the Dockerfiles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_copy_source_is_in_the_build_context(dockerfile):
    sources = copy_sources(REPO / dockerfile)
    assert sources, f"{dockerfile}: no COPY"
    for source in sources:
        assert "$" not in source, f"{dockerfile}: COPY {source}: a build argument; check its default here"
        assert list(REPO.glob(source.rstrip("/") or ".")), (
            f"{dockerfile}: COPY {source}: not in the repository root, the build context")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_no_dockerignore_drops_a_copied_source(dockerfile):
    ignore = REPO / ".dockerignore"
    if not ignore.exists():
        return
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith("!")]
    for source in copy_sources(REPO / dockerfile):
        dropped = [p for p in patterns if fnmatch.fnmatch(source.rstrip("/"), p.rstrip("/"))]
        assert not dropped, f"{dockerfile}: COPY {source} is excluded by .dockerignore {dropped}"


def test_the_chart_names_the_dockerfiles_its_images_come_from():
    values = (CHART / "values.yaml").read_text()
    assert "top-level Dockerfile" in values and BENCH_DOCKERFILE in values


# ----- the README's build, tag, push and helm lines --------------------------------------------------------


def readme_builds() -> list[dict[str, str]]:
    builds = [docker_build(command) for command in readme_commands("docker build ")]
    assert builds, "the README shows no `docker build` line"
    return builds


def test_readme_builds_each_image_from_its_dockerfile_and_the_repository_root():
    builds = readme_builds()
    assert sorted(b["file"] for b in builds) == sorted(DOCKERFILES), builds
    for build in builds:
        context = REPO / build["context"]
        assert context.is_dir() and context.resolve() == REPO, (
            f"{build}: the context must be the repository root (both Dockerfiles copy pyproject.toml and "
            f"both packages)")
        assert (REPO / build["file"]).is_file(), f"{build}: no such Dockerfile"
        for source in copy_sources(REPO / build["file"]):
            assert list(context.glob(source.rstrip("/"))), f"{build}: COPY {source} is not in the context"


def test_readme_build_lines_are_the_dockerfiles_own():
    for build in readme_builds():
        own = [docker_build(line) for line in header_build_lines(REPO / build["file"])]
        assert build in own, (
            f"README builds {build}, but {build['file']}'s header comment says {own}: make them the same")


def test_readme_builds_the_tags_the_chart_defaults_to():
    defaults = chart_defaults()
    built = {b["file"]: b["tag"] for b in readme_builds()}
    assert built == defaults, f"README builds {built}; the chart runs {defaults} by default"


def test_readme_names_every_copied_source():
    section = readme_section("Building the images")
    named = set(re.findall(r"`([^`\s]+)`", section))
    for dockerfile in DOCKERFILES:
        for source in copy_sources(REPO / dockerfile):
            assert source in named, f"README's Building the images does not say {dockerfile} copies `{source}`"


def helm_sets(command: str) -> dict[str, str]:
    tokens = shlex.split(command)
    sets = {}
    for i, token in enumerate(tokens):
        if token in ("--set", "--set-string"):
            key, _, value = tokens[i + 1].partition("=")
            sets[key] = value
        elif token.startswith(("--set=", "--set-string=")):
            key, _, value = token.partition("=")[2].partition("=")
            sets[key] = value
    return sets


def test_readme_pushes_what_it_built_and_points_the_chart_at_it():
    built = {b["tag"]: b["file"] for b in readme_builds()}
    tagged = {}
    for command in readme_commands("docker tag "):
        source, target = shlex.split(command)[2:4]
        assert source in built, f"`{command}`: {source} is not an image the README builds ({sorted(built)})"
        tagged[target] = built[source]
    pushed = {shlex.split(command)[2] for command in readme_commands("docker push ")}
    assert pushed, "the README pushes no image"
    assert pushed <= set(tagged) | set(built), f"pushed {pushed}, but only {sorted(tagged)} were tagged"
    by_file = {tagged.get(image, built.get(image)): image for image in pushed}
    assert set(by_file) == set(DOCKERFILES), f"the README pushes {by_file}: one image of each Dockerfile"

    pointing = [helm_sets(command) for command in readme_commands("helm ")
                if "image.repository" in helm_sets(command) or "config.benchmarkImage" in helm_sets(command)]
    assert pointing, "no helm line of the README points the chart at the pushed images"
    for sets in pointing:
        repository, tag = split_image(by_file[OPERATOR_DOCKERFILE])
        assert sets.get("image.repository") == repository, sets
        assert sets.get("image.tag", tag) == tag, sets
        assert sets.get("config.benchmarkImage") == by_file[BENCH_DOCKERFILE], sets


def test_the_parsers_see_what_they_should():
    assert docker_build("docker build -f benchmark-job/Dockerfile -t a/b:1 .") == {
        "file": "benchmark-job/Dockerfile", "tag": "a/b:1", "context": "."}
    assert docker_build("docker build -t a/b:1 .")["file"] == "Dockerfile"
    assert "operator/" in copy_sources(REPO / OPERATOR_DOCKERFILE)
    assert helm_sets("helm install x c --set image.repository=r/s --set config.benchmarkImage=r/b:1") == {
        "image.repository": "r/s", "config.benchmarkImage": "r/b:1"}
    assert split_image("registry.example.com:5000/ml/specpilot:0.1.0") == (
        "registry.example.com:5000/ml/specpilot", "0.1.0")
