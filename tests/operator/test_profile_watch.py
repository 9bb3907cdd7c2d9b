"""A finished profile is acted on at once, not at the next periodic reconciliation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.operator.scenario import (
    H100,
    deployment,
    jobs,
    node,
    profiles,
    publish_results,
    sdep,
    speculative_config,
    status,
)

pytestmark = pytest.mark.operator


@pytest.fixture
def operator_config(operator_config: Path) -> Path:
    # the suite's config, except that the periodic reconciliation never comes within the test: only the
    # profile watch can react
    config = yaml.safe_load(operator_config.read_text())
    config.update({"reconcileIntervalSeconds": 3600, "profileWatchSeconds": 0.5})
    operator_config.write_text(yaml.safe_dump(config))
    return operator_config


async def test_finished_profiles_are_decided_without_waiting_for_the_timer(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3 and len(jobs(sandbox)) == 2,
                           what="3 profiles and 2 Jobs from the reconciliation on create")
    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
    await sandbox.wait_for(lambda: status(sandbox).get("phase") == "Profiling", what="phase Profiling")

    # The Jobs' results land in the profiles' status (as the benchmark writes them): no change to the
    # SpeculativeDeployment itself, and the next periodic reconciliation is an hour away.
    assert len(await publish_results(sandbox, "H100-SXM")) == 3
    await sandbox.wait_for(lambda: status(sandbox).get("phase") == "Serving", what="phase Serving")
    decision = status(sandbox)["pools"][0]["decision"]
    config = await sandbox.wait_for(lambda: speculative_config(deployment(sandbox, "h100")),
                                    what="the decided --speculative-config in the Deployment")
    assert config["method"] == decision["method"]
