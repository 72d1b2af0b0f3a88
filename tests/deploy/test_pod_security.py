"""Every pod the chart renders meets the Pod Security Standards ``restricted`` profile.

The controls are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/
(baseline, then restricted), as the ``pod-security.kubernetes.io/enforce: restricted`` admission
checks them for Kubernetes 1.27 to 1.30. Each is checked on the rendered pod spec of every
workload and test hook of every scenario, so a namespace enforcing ``restricted`` admits them all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import pytest

from tests.deploy.chart import CHART, render, scenarios

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# Scenarios plus value sets that switch on every optional pod (vLLM, the helm test pod).
EXTRA = {"vllm-runtime-loading": {"vllm.enabled": "true", "vllm.adapters.runtimeLoading": "true"}}


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in WORKLOADS:
            yield name, d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield name, d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield name, d["spec"]


def containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def violations(spec: Mapping[str, Any]) -> list[str]:
    """The restricted-profile controls ``spec`` breaks, one line each (empty: admitted)."""
    out: list[str] = []
    pod_sc: Mapping[str, Any] = spec.get("securityContext") or {}
    # -- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key}: true")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"unsafe sysctl {sysctl['name']}")
    # -- restricted: volumes
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: {sorted(kinds - RESTRICTED_VOLUMES)} not allowed")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"pod seccompProfile {pod_seccomp}")
    for c in containers(spec):
        name = c["name"]
        sc: Mapping[str, Any] = c.get("securityContext") or {}
        caps: Mapping[str, Any] = sc.get("capabilities") or {}
        # baseline
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {sc['procMount']}")
        selinux: Mapping[str, Any] = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"{name}: seLinuxOptions {dict(selinux)}")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: appArmorProfile Unconfined")
        # restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot not true (pod {pod_non_root})")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
    return out


@cache
def rendered(key: str) -> tuple[dict[str, Any], ...]:
    if key in EXTRA:
        return tuple(render(set_values=EXTRA[key]))
    return tuple(render([CHART / "ci" / f"{key}-values.yaml"]))


CASES = [p.stem.removesuffix("-values") for p in scenarios()] + sorted(EXTRA)


@pytest.mark.parametrize("case", CASES)
def test_every_pod_meets_the_restricted_profile(helm: str, case: str) -> None:
    specs = list(pod_specs(list(rendered(case))))
    if case != "in-pod":
        assert specs, "no pod rendered"
    broken = {name: v for name, spec in specs if (v := violations(spec))}
    assert broken == {}


def test_the_check_sees_a_violation() -> None:
    """The checker is not vacuous: a root pod with a hostPath and no seccomp is refused."""
    spec = {
        "securityContext": {"runAsUser": 0},
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}],
    }
    found = violations(spec)
    assert any("hostPath" in v for v in found)
    assert any("runAsNonRoot" in v for v in found)
    assert any("seccompProfile" in v for v in found)
    assert any("SYS_ADMIN" in v for v in found)
    assert any("allowPrivilegeEscalation" in v for v in found)


def test_vllm_writes_only_to_its_emptydirs(helm: str) -> None:
    """With a read-only root, vLLM's caches go under HOME, an emptyDir, and /tmp is one too."""
    docs = rendered("vllm-runtime-loading")
    spec = next(s for n, s in pod_specs(list(docs)) if n.endswith("-vllm"))
    c = spec["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    assert env["HOME"] in mounts and mounts[env["HOME"]] in empty
    assert mounts["/tmp"] in empty and mounts["/dev/shm"] in empty


def test_vllm_has_a_disruption_budget(helm: str) -> None:
    docs = rendered("full")
    pdbs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodDisruptionBudget"}
    vllm = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-vllm"))
    budget = pdbs[vllm["metadata"]["name"]]
    assert budget["spec"]["selector"]["matchLabels"] == vllm["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["maxUnavailable"] == 1
