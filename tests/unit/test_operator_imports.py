"""What the operator's process loads: optional packages it never uses stay out of its memory (issue 27)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from specpilot.controller.cli import skipping_imports
with skipping_imports():
    import kopf
    from specpilot.controller.handlers import register
    from specpilot.controller.kube import Kube
print(sorted(m for m in ("kubernetes_validate", "jsonschema", "kubernetes") if sys.modules.get(m)))
import kubernetes, kubernetes_validate, jsonschema  # noqa: E401 - afterwards they import as usual (the sandbox, `specpilot validate`, an exec plugin's login)
from specpilot.api.validate import validate_custom_resource  # noqa: F401
print("later", kubernetes.__name__, kubernetes_validate.__name__, jsonschema.__name__)
"""


def test_the_operator_loads_without_the_official_client_and_validators_and_they_still_import_after():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1] == "later kubernetes kubernetes_validate jsonschema"
