#!/usr/bin/env bash
# The project's test command: sets everything up (scripts/setup.sh --test), then runs every test.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not vllm"`).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
bash scripts/setup.sh --test
.venv/bin/specpilot crds --check
set +e
# --durations: the slowest tests, and -rs: why each skipped test skipped, so a CI log says both.
# -n: pytest-xdist workers (SPECPILOT_TEST_WORKERS, default 3; `-n 0` as an argument runs in one process). Most
# of the suite waits on processes it started (the operator, the sandbox API server, Prometheus, engines), so
# three workers on two cores overlap the waiting; each file stays on one worker (--dist loadfile), and the
# real-engine files run as one chain on one worker, sent first, and the demo is sent last (tests/conftest.py).
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -rs \
    -n "${SPECPILOT_TEST_WORKERS:-3}" --dist loadfile "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
if [[ ${rc} -eq 5 ]]; then
    echo "test: pytest collected no tests" >&2
    exit 1
fi
exit ${rc}
