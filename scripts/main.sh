#!/usr/bin/env bash
# The main job: sets up .venv (scripts/setup.sh) and runs `specpilot demo` (the whole loop) on this machine,
# with no GPU and no cluster. Extra arguments go to the command (e.g. `scripts/main.sh --fast`).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
bash scripts/setup.sh
exec .venv/bin/specpilot demo "$@"
