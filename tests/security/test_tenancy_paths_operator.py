"""The paths of issue 25, tried against the real operator (kopf, on the sandbox API server): a spec that would
put the ServiceAccount token beside tenant code, run as root by a string uid, or load code into the engine
through a variable, a flag or a ConfigMap gets Valid=False and one Event naming each field and its fix, and
nothing is created for it."""

from __future__ import annotations

import pytest

from tests.operator.conftest import operator, operator_config, sandbox  # noqa: F401  (fixtures)
from tests.operator.scenario import H100, NAMESPACE, condition, events, jobs, node, profiles, sdep, status

pytestmark = pytest.mark.operator


async def test_the_paths_past_the_tenancy_check_are_closed(sandbox, operator):  # noqa: F811
    await sandbox.create(node("gpu-1", H100, "h100"))
    await sandbox.create(sdep(
        model={"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama",
               "env": [{"name": "OPENSSL_CONF", "value": "/models/evil.cnf"},
                       {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"}],
               "extraArgs": ["--worker_extension_cls=evil.Ext", "--kv-transfer-config.kv_connector_module_path",
                             "evil"]},
        profiling={"podOverrides": {
            "securityContext": {"runAsUser": "0", "supplementalGroups": [0]},
            "volumes": [{"name": "code", "configMap": {"name": "innocent"}}],
            "initContainers": [{"name": "engine", "volumeMounts": [
                {"name": "kube-api-access", "mountPath": "//var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "containers": [
                {"name": "engine", "volumeMounts": [
                    {"name": "code", "mountPath": "/usr/lib/python3.12/site-packages/sitecustomize.py"}]},
                {"name": "bench", "env": [{"name": "EXTRA", "value": "1"}]}],
        }},
    ))

    valid = await sandbox.wait_for(lambda: condition(sandbox, "Valid"), what="the Valid condition")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    overrides = "spec.profiling.podOverrides"
    for expected in (
        "spec.model.env[0].name 'OPENSSL_CONF' is not allowed",
        "spec.model.env[1].name 'VLLM_ALLOW_RUNTIME_LORA_UPDATING' is not allowed",
        "spec.model.extraArgs[0] ('--worker_extension_cls=evil.Ext') sets --worker-extension-cls, which makes the "
        "engine import code",
        "spec.model.extraArgs[1] ('--kv-transfer-config.kv_connector_module_path') sets --kv-transfer-config",
        f"{overrides}.securityContext.runAsUser must be a uid written as an integer (got '0')",
        f"{overrides}.securityContext.supplementalGroups[0] is 0 (root)",
        f"{overrides}.initContainers[0] (name 'engine') takes the name of a container specpilot runs",
        f"{overrides}.initContainers[0].volumeMounts[0].name 'kube-api-access' is the ServiceAccount token volume",
        f"{overrides}.initContainers[0].volumeMounts[0].mountPath '//var/run/secrets/kubernetes.io/serviceaccount' "
        f"(that is '/var/run/secrets/kubernetes.io/serviceaccount') is specpilot's own mount",
        f"{overrides}.containers[0].volumeMounts[0].mountPath '/usr/lib/python3.12/site-packages/sitecustomize.py' "
        f"is in the system's or Python's own files",
        f"{overrides}.containers[1].env is not allowed: the bench container holds the result token",
    ):
        assert expected in valid["message"], (expected, valid["message"])
    warning = await sandbox.wait_for(lambda: events(sandbox, "InvalidSpec"), what="an InvalidSpec Event")
    assert warning[0]["type"] == "Warning" and "OPENSSL_CONF" in warning[0]["message"]

    await operator.wait_periodic_runs(sandbox, 2)  # reconciliations: still nothing created, one Event, alive
    assert sandbox.objects("deployments", NAMESPACE) == []
    assert jobs(sandbox) == [] and profiles(sandbox) == []
    assert len(events(sandbox, "InvalidSpec")) == 1
    assert operator.proc.poll() is None
    assert status(sandbox)["phase"] == "Failed"
