"""An offline checker of the `restricted` Pod Security Standard (kubernetes.io/docs/concepts/security/
pod-security-standards, policy version latest as of Kubernetes 1.34), for the pod templates the operator and
the chart produce.

It implements the baseline and restricted controls that a pod spec alone decides: host namespaces,
privileged, capabilities, hostPath and volume types, host ports, AppArmor, SELinux, /proc mount, seccomp,
sysctls, privilege escalation and running as non-root. `violations(pod_spec)` returns one line per broken
control, naming the field.
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUME_TYPES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                     "persistentVolumeClaim", "projected", "secret", "image"})
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                          "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                          "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                          "net.ipv4.tcp_keepalive_probes"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})


def _containers(pod_spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(pod_spec.get(field) or []):
            out.append((f"{field}[{i}]({container.get('name')})", container))
    return out


def violations(pod_spec: dict[str, Any]) -> list[str]:
    """Every `restricted` control `pod_spec` breaks (empty: it passes)."""
    problems: list[str] = []
    pod_sc = pod_spec.get("securityContext") or {}
    containers = _containers(pod_spec)

    # baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"{field} is true")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("securityContext.windowsOptions.hostProcess is true")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{where}.securityContext.privileged is true")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess is true")
        if sc.get("procMount") not in (None, "Default"):
            problems.append(f"{where}.securityContext.procMount is {sc.get('procMount')}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}.ports hostPort {port['hostPort']}")
        for scope, ctx in ((where, sc), ("pod", pod_sc)):
            se = ctx.get("seLinuxOptions") or {}
            if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
                problems.append(f"{scope}.securityContext.seLinuxOptions {se}")
            aa = (ctx.get("appArmorProfile") or {}).get("type")
            if aa not in (None, "RuntimeDefault", "Localhost"):
                problems.append(f"{scope}.securityContext.appArmorProfile.type is {aa}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"securityContext.sysctls {sysctl.get('name')} is not a safe sysctl")

    # restricted
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in RESTRICTED_VOLUME_TYPES:
                problems.append(f"volumes[{i}]({volume.get('name')}) is a {kind} volume")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        problems.append(f"securityContext.seccompProfile.type is {pod_seccomp}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("securityContext.runAsUser is 0")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop does not include ALL")
        added = [cap for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
        if added:
            problems.append(f"{where}.securityContext.capabilities.add has {added}")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{where}: runAsNonRoot is not true (neither the container nor the pod sets it)")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
    return problems


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every pod an object would run: a Pod, or the template of a workload."""
    kind = obj.get("kind")
    name = f"{kind}/{(obj.get('metadata') or {}).get('name')}"
    if kind == "Pod":
        return [(name, obj["spec"])]
    spec = obj.get("spec") or {}
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    template = spec.get("template")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob") and template:
        return [(name, template["spec"])]
    return []
