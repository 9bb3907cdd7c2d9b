"""The examples and the documentation's commands: what a newcomer copies works as written.

- The baseline example is the no-speculation profile of the same engine as the EAGLE-3 example, derived
  from the twin (`python tests/unit/test_examples.py` writes it again after a change of either).
- Every `specpilot ...` command line README.md and docs/*.md show with files under examples/ exits 0.
- Every field name the README's configuration table mentions exists in the models (or the chart's values).
- The README's first SpeculativeDeployment is examples/minimal.yaml as the file is, and every example that
  serves a gated model names its Hugging Face token.
- No file of the repository points at notes that are not in it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
METHOD_EXAMPLE = "speculationprofile-h100-eagle3.yaml"
BASELINE_EXAMPLE = "speculationprofile-h100-baseline.yaml"

BASELINE_HEADER = """\
# A no-speculation baseline SpeculationProfile as specpilot's benchmark Job writes it: Llama-3.1-8B on one
# H100 SXM, one engine start at K=0. It is the baseline of speculationprofile-h100-eagle3.yaml (the same
# model, GPU type, engine image, workload and levels), so the two together are what `specpilot plan` needs:
#   specpilot plan --profile examples/speculationprofile-h100-baseline.yaml examples/speculationprofile-h100-eagle3.yaml
# Derived from specpilot's twin (specpilot.sim.synthetic): at each level, the EAGLE-3 profile's k=1 step time
# (ITL) and TTFT times the twin's ratio of the plain engine to the EAGLE-3 engine at k=1; TPOT = ITL at K=0,
# throughput = concurrency / TPOT. Written by `python tests/unit/test_examples.py`.
"""


def _scaled(stats: dict, ratio: float, digits: int) -> dict:
    return {key: round(value * ratio, digits) if digits else round(value * ratio) for key, value in stats.items()}


def baseline_for(method_doc: dict) -> dict:
    """The baseline profile of the engine `method_doc` measured, from the twin's baseline-to-method ratios."""
    from specpilot.api.profile import SpeculationProfile
    from specpilot.sim.synthetic import Scenario, synthetic_profiles

    method = SpeculationProfile.model_validate(method_doc)
    spec, status = method.spec, method.status
    scenario = Scenario(spec.sku, spec.model.id, spec.method.method, workload=spec.workload.name,
                        max_k=spec.method.num_speculative_tokens, tensor_parallel_size=spec.model.tensor_parallel_size,
                        output_len=spec.workload.output_len)
    twin_base, twin_method = synthetic_profiles(scenario, noise=0.0, levels=spec.concurrency_levels,
                                                requests_per_level=spec.requests_per_level)
    kv_capacity = round(status.kv_capacity_tokens * twin_base.status.kv_capacity_tokens
                        / twin_method.status.kv_capacity_tokens)
    k1_doc = next(r for r in method_doc["status"]["runs"] if r["numSpeculativeTokens"] == 1)
    measured = {p["concurrency"]: p for p in k1_doc["points"]}
    output_len = spec.workload.output_len
    points = []
    for base, k1 in zip(twin_base.status.runs[0].points, twin_method.status.run(1).points, strict=True):
        c = base.concurrency
        e = measured[c]
        itl = _scaled(e["itlMs"], base.itl_ms.p50 / k1.itl_ms.p50, 2)
        ttft = _scaled(e["ttftMs"], base.ttft_ms.p50 / k1.ttft_ms.p50, 0)
        tpot = dict(itl)  # one token per engine step without speculation
        e2e_ratio = ((ttft["mean"] + (output_len - 1) * tpot["mean"])
                     / (e["ttftMs"]["mean"] + (output_len - 1) * e["tpotMs"]["mean"]))
        output_throughput = c * 1000.0 / tpot["p50"]
        request_throughput = output_throughput / output_len
        points.append({
            "concurrency": c, "completed": e["completed"], "failed": 0,
            "durationS": round(e["completed"] / request_throughput, 2),
            "requestThroughput": round(request_throughput, 3), "outputThroughput": round(output_throughput, 1),
            "ttftMs": ttft, "tpotMs": tpot, "itlMs": itl, "e2eLatencyMs": _scaled(e["e2eLatencyMs"], e2e_ratio, 1),
            "generationTokens": e["generationTokens"], "meanRunning": e["meanRunning"], "meanWaiting": e["meanWaiting"],
            "kvCacheUsage": round(e["kvCacheUsage"] * status.kv_capacity_tokens / kv_capacity, 3), "preemptions": 0,
        })
    # the engine start and the time around the levels (warm-up) as in the method's k=1 run
    engine_start = k1_doc["engineStartS"]
    around = k1_doc["wallS"] - engine_start - sum(p["durationS"] for p in k1_doc["points"])
    wall = round(engine_start + around + sum(p["durationS"] for p in points), 1)
    # one benchmark Job at a time per pool: the baseline ran just before the method's profile, and took the
    # method's time outside its runs (pod start, model download) plus its one run
    started, completed = (datetime.fromisoformat(status_time) for status_time in
                          (method_doc["status"]["startedAt"], method_doc["status"]["completedAt"]))
    outside = (completed - started).total_seconds() - sum(r["wallS"] for r in method_doc["status"]["runs"])
    base_completed = started - timedelta(seconds=41)
    base_started = base_completed - timedelta(seconds=round(outside + wall))

    base_spec = {key: value for key, value in method_doc["spec"].items() if key != "method"}
    name = SpeculationProfile.model_validate({"spec": base_spec}).spec.object_name()
    metadata = dict(method_doc["metadata"], name=name,
                    labels={**method_doc["metadata"]["labels"], "specpilot.io/method": "baseline"})
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return {
        "apiVersion": method_doc["apiVersion"], "kind": method_doc["kind"], "metadata": metadata, "spec": base_spec,
        "status": {
            "phase": "Succeeded", "attempts": 1, "jobName": f"bench-{name}",
            "engineVersion": method_doc["status"]["engineVersion"],
            "startedAt": base_started.strftime(stamp), "completedAt": base_completed.strftime(stamp),
            "runs": [{"numSpeculativeTokens": 0, "points": points, "engineStartS": engine_start, "wallS": wall}],
            "kvCapacityTokens": kv_capacity, "maxConcurrencyMeasured": max(spec.concurrency_levels),
            "engineStarts": 1, "hardware": method_doc["status"]["hardware"],
        },
    }


def baseline_text() -> str:
    method_doc = yaml.safe_load((EXAMPLES / METHOD_EXAMPLE).read_text())
    return BASELINE_HEADER + yaml.safe_dump(baseline_for(method_doc), sort_keys=False, width=120)


def _example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


# ----- the baseline example ------------------------------------------------------------------------------


def test_baseline_example_is_derived_from_the_eagle3_example_and_the_twin():
    assert (EXAMPLES / BASELINE_EXAMPLE).read_text() == baseline_text(), (
        f"examples/{BASELINE_EXAMPLE} is out of date with examples/{METHOD_EXAMPLE} or the twin: "
        f"run `python tests/unit/test_examples.py` and commit it")


def test_baseline_example_is_the_same_measurement_without_a_method():
    from specpilot.api.profile import SpeculationProfile

    base = SpeculationProfile.model_validate(_example(BASELINE_EXAMPLE))
    method = SpeculationProfile.model_validate(_example(METHOD_EXAMPLE))
    assert base.spec.method is None and method.spec.method is not None
    same = ("model", "sku", "gpu_product", "engine_image", "workload", "concurrency_levels", "requests_per_level")
    assert {f: getattr(base.spec, f) for f in same} == {f: getattr(method.spec, f) for f in same}
    assert base.metadata["name"] == base.spec.object_name()
    assert base.status.phase == "Succeeded" and [r.num_speculative_tokens for r in base.status.runs] == [0]
    # no drafter: more KV cache, and each engine step (ITL) shorter than the drafter-loaded engine's at k=1
    assert base.status.kv_capacity_tokens > method.status.kv_capacity_tokens
    k1 = method.status.run(1)
    for b, m in zip(base.status.runs[0].points, k1.points, strict=True):
        assert b.concurrency == m.concurrency
        assert b.itl_ms.p50 < m.itl_ms.p50
        assert b.output_throughput < m.output_throughput  # EAGLE-3 at k=1 pays at every profiled level
        assert b.ttft_ms.p50 <= m.ttft_ms.p50
        assert b.num_drafts is None and not b.accepted_per_position
    assert base.status.completed_at <= method.status.started_at


def test_plan_decides_on_the_example_profiles(capsys):
    from specpilot.cli import main

    files = [str(EXAMPLES / BASELINE_EXAMPLE), str(EXAMPLES / METHOD_EXAMPLE)]
    assert main(["plan", "--profile", *files]) == 0
    out = capsys.readouterr().out
    assert "chosen: eagle3" in out and "--speculative-config" in out


# ----- the documented commands ---------------------------------------------------------------------------


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for each `specpilot ...` line of README.md and docs/*.md naming examples/."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        lines = []
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            joined = re.sub(r"\s*\\\n\s*", " ", block)  # shell continuation lines
            lines += [line.strip().removeprefix("$ ") for line in joined.splitlines()]
        lines += re.findall(r"`(specpilot [^`]+)`", text)
        for line in lines:
            line = line.split(" #")[0].strip()
            if line.startswith("specpilot ") and "examples/" in line:
                found.append((doc.relative_to(REPO).as_posix(), line))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands_on_the_examples():
    subcommands = {shlex.split(line)[1] for _, line in COMMANDS}
    assert {"plan", "validate"} <= subcommands, COMMANDS


@pytest.mark.parametrize("where, line", COMMANDS, ids=[f"{w}: {line}" for w, line in COMMANDS])
def test_documented_command_runs(where, line, capsys, monkeypatch):
    from specpilot.cli import main

    monkeypatch.chdir(REPO)
    argv = shlex.split(line)
    for arg in argv[1:]:
        if arg.startswith("examples/"):
            assert (REPO / arg).exists(), f"{where}: `{line}` names {arg}, which is not in the repository"
    code = main(argv[1:])
    captured = capsys.readouterr()
    assert code == 0, f"{where}: `{line}` exited {code}:\n{captured.out}\n{captured.err}"


def test_the_examples_validate_without_a_warning_under_the_charts_defaults():
    """What a user who follows the README's install gets: the examples as the chart's operator would take them
    (llama-70b names the chart's own prometheusUrl, which needs no allow-list entry)."""
    import sys

    script = Path(sys.executable).parent / "specpilot"
    done = subprocess.run([str(script), "validate", "examples/", "--operator-config", "charts/specpilot/values.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert "warning" not in done.stdout.lower(), done.stdout
    lines = done.stdout.splitlines()
    assert lines and all(line.endswith(": valid") for line in lines), done.stdout
    assert len(lines) == len(list(EXAMPLES.glob("*.yaml")))


# ----- the README's first SpeculativeDeployment ----------------------------------------------------------

FIRST_DEPLOYMENT = "minimal.yaml"
GATED = ("meta-llama/",)
"""Hugging Face organisations whose models are gated (the licence is accepted on Hugging Face, then a token
downloads them)."""


def test_the_readmes_first_deployment_is_the_example_file():
    """What a newcomer copies from the README is examples/minimal.yaml as it is, applied from that file, after the
    command that creates the Secret its hfTokenSecretRef names."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)
    deployments = [block for block in blocks if "kind: SpeculativeDeployment" in block]
    assert deployments, "README shows no SpeculativeDeployment"
    assert deployments[0] == (EXAMPLES / FIRST_DEPLOYMENT).read_text(), (
        f"README's first SpeculativeDeployment is not examples/{FIRST_DEPLOYMENT} as the file is: copy the file "
        f"into the README's block")
    shown_at = text.index(deployments[0])
    applied = re.search(rf"^kubectl apply .*-f examples/{re.escape(FIRST_DEPLOYMENT)}$", text, flags=re.M)
    assert applied and applied.start() > shown_at, f"README does not apply examples/{FIRST_DEPLOYMENT} after it"
    ref = _example(FIRST_DEPLOYMENT)["spec"]["model"]["hfTokenSecretRef"]
    secret = re.search(r"^kubectl create secret generic (\S+) -n (\S+) --from-literal=([^=\s]+)=", text, flags=re.M)
    assert secret and secret.start() < shown_at, "README does not create the token's Secret before the example"
    assert (secret.group(1), secret.group(3)) == (ref["name"], ref["key"]), (secret.groups(), ref)
    assert re.search(rf"^kubectl apply -n {re.escape(secret.group(2))} ", applied.group(0)), (
        "the Secret and the deployment go to different namespaces")


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_an_example_that_serves_a_gated_model_names_its_token(name):
    doc = _example(name)
    if doc.get("kind") != "SpeculativeDeployment":
        return
    models = [doc["spec"]["model"]["id"], *(m.get("model") or "" for m in doc["spec"]["methods"])]
    gated = [m for m in models if m.startswith(GATED)]
    assert not gated or doc["spec"]["model"].get("hfTokenSecretRef"), (
        f"examples/{name} serves {gated}, gated on Hugging Face, without spec.model.hfTokenSecretRef")


# ----- the README's configuration table ------------------------------------------------------------------


def _configuration_rows() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and not set(cells[0]) <= set("- ") and cells[0] != "where":
            rows.append((cells[0], cells[1]))
    return rows


def _schema_names(schema: dict) -> set[str]:
    """Every property name anywhere under an openAPIV3Schema node."""
    names: set[str] = set()
    for name, sub in (schema.get("properties") or {}).items():
        names.add(name)
        names |= _schema_names(sub)
    if "items" in schema:
        names |= _schema_names(schema["items"])
    return names


def _value_keys(values: dict) -> set[str]:
    keys: set[str] = set()
    for key, value in values.items():
        keys.add(key)
        if isinstance(value, dict):
            keys |= _value_keys(value)
    return keys


def test_configuration_table_names_only_real_fields():
    from specpilot.api.crd import all_crds

    crd = next(c for c in all_crds().values() if c["spec"]["names"]["kind"] == "SpeculativeDeployment")
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    chart_values = yaml.safe_load((REPO / "charts" / "specpilot" / "values.yaml").read_text())
    rows = _configuration_rows()
    checked = 0
    for where, what in rows:
        names = re.findall(r"`([A-Za-z][A-Za-z0-9]*)`", what)
        section = re.fullmatch(r"`spec\.([A-Za-z]+)(?:\[\])?`", where)
        if section:
            assert section.group(1) in spec_schema["properties"], f"README configuration: no spec.{section.group(1)}"
            known = _schema_names(spec_schema["properties"][section.group(1)])
        elif "values.yaml" in where:
            known = _value_keys(chart_values)
        else:
            continue
        unknown = [n for n in names if n not in known]
        assert not unknown, f"README configuration row {where}: no field {unknown} in the models"
        checked += len(names)
    sections = {m.group(1) for w, _ in rows if (m := re.fullmatch(r"`spec\.([A-Za-z]+)(?:\[\])?`", w))}
    assert sections == set(spec_schema["properties"]), "every spec section has its row in the README"
    assert checked > 40


# ----- no pointers to notes outside the repository -------------------------------------------------------


def test_no_file_points_at_notes_outside_the_repository():
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    private = [f"{name}.md" for name in ("FACTS", "DESIGN", "STYLE")] + ["../" + "shared"]
    hits = []
    for name in filter(None, files):
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{name}: {word}" for word in private if word in text]
    assert not hits, "files that point at notes which are not in the repository: " + ", ".join(hits)


if __name__ == "__main__":
    (EXAMPLES / BASELINE_EXAMPLE).write_text(baseline_text())
    print(f"wrote examples/{BASELINE_EXAMPLE}")
