"""Why a benchmark Job's pod failed or does not start, in words, from what the kubelet recorded. Pure.

The controller reads the Job's pods (by the Job's uid label) when the Job has failed for good, or while it
is active with no pod ready, and hands them here; nothing is decided from them, they only explain. What a
pod's status says comes from three sources of different trust:

- the kubelet's own words (a container's state and reason: OOMKilled, ErrImagePull, exit codes; the
  scheduler's PodScheduled condition): reported as they are, bounded;
- the bench container's termination message (`/dev/termination-log`, written by `specpilot-bench`, the
  operator's image; with `FallbackToLogsOnError` the end of its log when it died without writing one): its
  own error line. It may quote what the engine answered, so it is cleaned like the engine's text;
- the engine container's termination message or log tail: the tenant's image and code, so untrusted. It is
  cut to a few lines and bytes, stripped of control characters, scrubbed of anything that looks like a
  secret, flattened to one line and quoted between guillemets it cannot contain, so it cannot forge the
  structure of the message it appears in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..manifests.names import BENCH_CONTAINER, ENGINE_CONTAINER, SUPERVISOR_INSTALL_CONTAINER

__all__ = [
    "ENGINE_TEXT_BYTES",
    "bench_account",
    "engine_message",
    "ENGINE_TEXT_LINES",
    "IMAGE_PULL_REASONS",
    "job_pod_selector",
    "pod_account",
    "pod_not_starting",
    "scrub_secrets",
    "untrusted_text",
]

ENGINE_TEXT_LINES = 4
"""Last lines of the engine container's text quoted."""
ENGINE_TEXT_BYTES = 400
"""At most this many bytes of them (UTF-8), the end kept."""
BENCH_TEXT_BYTES = 600
"""The bench's own error line, at most."""
KUBELET_TEXT_BYTES = 300
"""A kubelet's or scheduler's message (an image pull error, "0/4 nodes are available: ..."), at most."""

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                "RegistryUnavailable"})
"""A container's waiting reasons that mean its image cannot be pulled."""
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
"""Waiting reasons that mean the container cannot be created as specified."""
OPEN, CLOSE = "«", "»"
"""Around quoted pod text; removed from inside it, so a quote cannot be closed early."""
SCRUBBED = "***"

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_SECRETS = [
    # Hugging Face, GitHub, OpenAI-style and AWS access keys
    (re.compile(r"\b(hf|api_org)_[A-Za-z0-9]{8,}"), r"\1_" + SCRUBBED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{8,}"), SCRUBBED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), SCRUBBED),
    (re.compile(r"\bAKIA[0-9A-Z]{12,}"), SCRUBBED),
    # Authorization headers
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + SCRUBBED),
    # key=value and key: value pairs whose key names a secret (SPECPILOT_RESULT_TOKEN=..., password: ...)
    # (the key ends with the word: max_tokens=256 or tokenizer=... are not secrets)
    (re.compile(r"(?i)\b([\w.-]*?(?:token|secret|passw(?:or)?d|pwd|key|credentials?|auth))(\"?\s*[=:]\s*\"?)"
                r"[^\s\"',;]+"), r"\1\2" + SCRUBBED),
    # JSON Web Tokens (ServiceAccount tokens among them)
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), SCRUBBED),
    # long hex or base64 runs: the result token (64 hex digits), keys, signatures
    (re.compile(r"\b[0-9a-fA-F]{32,}\b"), SCRUBBED),
    # (a digit and a letter among them, no hyphen: a Kubernetes name or a long word is not a key)
    (re.compile(r"(?=[A-Za-z0-9+/_]{0,200}\d)(?=[A-Za-z0-9+/_]{0,200}[A-Za-z])[A-Za-z0-9+/_]{40,}={0,2}"),
     SCRUBBED),
]


def scrub_secrets(text: str, known: Iterable[str] = ()) -> str:
    """`text` with the `known` secrets and anything shaped like a token, key or password replaced by ***."""
    for secret in known:
        if secret and len(secret) >= 8:
            text = text.replace(secret, SCRUBBED)
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _cut_bytes(text: str, limit: int) -> str:
    """The end of `text` within `limit` UTF-8 bytes ("..." in front when cut)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return "..." + data[-(limit - 3):].decode(errors="ignore").lstrip()


def untrusted_text(text: Any, lines: int = ENGINE_TEXT_LINES, max_bytes: int = ENGINE_TEXT_BYTES,
                   known_secrets: Iterable[str] = ()) -> str:
    """Text a pod wrote, made safe to quote in a status message or Event: its last non-blank `lines` lines,
    without terminal escapes or control characters, secrets scrubbed, joined with " | " into one line, cut
    to `max_bytes` from the end, with the quote marks removed; "" when nothing is left."""
    if not isinstance(text, str) or not text:
        return ""
    # Bound the work before the regular expressions run: a termination message is at most 4 KiB, but a
    # status written by other means need not be.
    text = text[-64 * max(lines, 1) * 4:]
    text = _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    kept = [_CONTROL.sub(" ", line).replace("\t", " ").strip() for line in text.split("\n")]
    kept = [line for line in kept if line][-lines:]
    joined = " | ".join(scrub_secrets(line, known_secrets) for line in kept)
    joined = joined.replace(OPEN, "").replace(CLOSE, "")
    return _cut_bytes(re.sub(r" {2,}", " ", joined), max_bytes)


def _quoted(text: str) -> str:
    return f"{OPEN}{text}{CLOSE}"


def job_pod_selector(job: Mapping[str, Any]) -> str:
    """The label selector of a Job's pods: its uid (the Job controller labels every pod `controller-uid`,
    and a Job of the same name made again has another), else its name."""
    meta = job.get("metadata") or {}
    return f"controller-uid={meta['uid']}" if meta.get("uid") else f"job-name={meta.get('name', '')}"


def _owned_by(pod: Mapping[str, Any], job_uid: str | None) -> bool:
    if not job_uid:
        return True
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == job_uid and o.get("kind") == "Job" for o in owners)


def _latest(pods: Sequence[Mapping[str, Any]], job_uid: str | None) -> Mapping[str, Any] | None:
    """The Job's newest pod (its last attempt)."""
    mine = [p for p in pods if _owned_by(p, job_uid)]
    if not mine:
        return None
    return max(mine, key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                                    str((p.get("metadata") or {}).get("name") or "")))


def _name(pod: Mapping[str, Any]) -> str:
    """The pod's name (the Job controller's: a DNS name), what else it holds dropped."""
    return re.sub(r"[^a-z0-9.-]", "", str((pod.get("metadata") or {}).get("name") or ""))[:253] or "?"


def _statuses(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    status = pod.get("status") or {}
    out = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(field) or []:
            if isinstance(cs, Mapping):
                out.append((str(cs.get("name") or "?")[:63], cs))
    return out


def _state(cs: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The container's `kind` state (waiting, terminated), the current one or, when it restarted, the last."""
    for holder in (cs.get("state"), cs.get("lastState")):
        if isinstance(holder, Mapping) and isinstance(holder.get(kind), Mapping):
            return holder[kind]
    return None


def _word(value: Any) -> str:
    """A reason as the kubelet writes one (a CamelCase word); anything else is not quoted."""
    text = str(value or "")
    return text if re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,63}", text) else "unknown reason"


def _image_fix(name: str) -> str:
    if name == ENGINE_CONTAINER:
        return "check spec.model.image and that the namespace may pull it (an imagePullSecret in " \
               "spec.profiling.podOverrides)"
    return "check the operator config's benchmarkImage (or spec.profiling.image) and that the namespace may pull it"


def _unschedulable(pod: Mapping[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                cond.get("reason") == "Unschedulable":
            said = untrusted_text(cond.get("message"), lines=1, max_bytes=KUBELET_TEXT_BYTES)
            return ("the pod cannot be scheduled" + (f" ({said})" if said else "")
                    + ": no node of the pool can take it (the pool's nodeSelector, free GPUs, taints)")
    return ""


def _waiting(name: str, cs: Mapping[str, Any]) -> str:
    state = cs.get("state")
    waiting = state.get("waiting") if isinstance(state, Mapping) else None
    if not isinstance(waiting, Mapping):
        return ""
    reason = _word(waiting.get("reason"))
    said = untrusted_text(waiting.get("message"), lines=1, max_bytes=KUBELET_TEXT_BYTES)
    detail = f" ({said})" if said else ""
    if reason in IMAGE_PULL_REASONS:
        image = untrusted_text(cs.get("image"), lines=1, max_bytes=200)
        return f"{name} container: image {image or '?'} cannot be pulled: {reason}{detail}; {_image_fix(name)}"
    if reason in CONFIG_REASONS:
        return f"{name} container cannot start: {reason}{detail}"
    return ""


def _terminated(name: str, cs: Mapping[str, Any], bench_said: bool, known_secrets: Iterable[str]) -> str:
    term = _state(cs, "terminated")
    if term is None:
        return ""
    code = term.get("exitCode")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    reason = _word(term.get("reason"))
    message = term.get("message")
    if reason == "OOMKilled":
        fix = ("raise the engine's memory limit (spec.model.resources.limits.memory)" if name == ENGINE_CONTAINER
               else "raise the bench container's memory (spec.profiling.podOverrides)")
        head = f"{name} container was OOMKilled (exit {code if code is not None else 137}): out of memory; {fix}"
    elif code in (0, None) and not message:
        return ""
    elif code in (0, None):
        head = f"{name} container completed"
    else:
        head = f"{name} container exited {code} ({reason})"
    if name == ENGINE_CONTAINER:
        said = untrusted_text(message, known_secrets=known_secrets)
        return head + (f"; its last log lines (the engine container's own text, unverified): {_quoted(said)}"
                       if said else "")
    if name == BENCH_CONTAINER and bench_said:
        return head  # its account is quoted already, from the sealed result
    said = untrusted_text(message, lines=2 if name == BENCH_CONTAINER else ENGINE_TEXT_LINES,
                          max_bytes=BENCH_TEXT_BYTES, known_secrets=known_secrets)
    return head + (f": {_quoted(said)}" if said else "")


def pod_account(pods: Sequence[Mapping[str, Any]], *, job_uid: str | None = None, bench_said: bool = False,
                known_secrets: Iterable[str] = (), earlier: str = "") -> str:
    """What the Job's last pod says about why it failed, as one clause ("" when it says nothing): the scheduler's
    verdict, each container's image pull error, OOM kill or exit, the bench's own error line (unless
    `bench_said`: the sealed result quotes it already) and the engine container's last log lines, quoted.
    `earlier`: what an earlier look at the pod found (`pod_not_starting`), said when the pod is gone (the Job
    controller deletes the pods of a Job past its deadline)."""
    pod = _latest(pods, job_uid)
    if pod is None:
        return f"its pod had not started: {earlier}" if earlier else ""
    name = _name(pod)
    parts = [_unschedulable(pod)]
    statuses = _statuses(pod)
    for container, cs in statuses:
        parts.append(_waiting(container, cs) or _terminated(container, cs, bench_said, known_secrets))
    parts = [p for p in parts if p]
    # The engine's quoted text goes last: whatever it says comes after the kubelet's words.
    parts.sort(key=lambda p: p.startswith(f"{ENGINE_CONTAINER} container") and OPEN in p)
    if not parts:
        if earlier:
            return f"its pod had not started: {earlier}"
        return ""
    return f"pod {name}: " + "; ".join(parts)


def engine_message(pods: Sequence[Mapping[str, Any]], job_uid: str | None = None) -> str:
    """The engine container's termination message of the Job's last pod as it wrote it ("" when none): untrusted,
    for `policy.model_access` to read (it chooses a reason by it), never to quote; `pod_account` quotes it."""
    pod = _latest(pods, job_uid)
    for container, cs in _statuses(pod) if pod is not None else ():
        term = _state(cs, "terminated") if container == ENGINE_CONTAINER else None
        if term is not None and isinstance(term.get("message"), str):
            return term["message"]
    return ""


def pod_not_starting(pods: Sequence[Mapping[str, Any]], job_uid: str | None = None) -> str:
    """Why an active Job's pod has not started, when the kubelet or scheduler says it cannot (an image that
    cannot be pulled, a container that cannot be created, no node to run on); "" while it is merely on its
    way (pulling, creating)."""
    pod = _latest(pods, job_uid)
    if pod is None:
        return ""
    parts = [_unschedulable(pod)] + [_waiting(container, cs) for container, cs in _statuses(pod)
                                     if container in (BENCH_CONTAINER, ENGINE_CONTAINER,
                                                      SUPERVISOR_INSTALL_CONTAINER)]
    parts = [p for p in parts if p]
    if not parts:
        return ""
    return f"pod {_name(pod)}: " + "; ".join(parts)


def bench_account(reason: Any, message: Any, known_secrets: Iterable[str] = ()) -> str:
    """The benchmark's own account of why it stopped (its sealed status.benchFailure) as one clause: its error
    line, cleaned; the lines after it (the engine's log as the bench saw it, when the engine did not start)
    quoted as the engine's text."""
    reason = _word(reason) if reason else "unknown reason"
    lines = [line for line in str(message or "")[-16384:].splitlines() if line.strip()]
    if not lines:
        return f"the benchmark says: {reason}"
    head = untrusted_text(lines[0], lines=1, max_bytes=BENCH_TEXT_BYTES, known_secrets=known_secrets)
    tail = untrusted_text("\n".join(line for line in lines[1:] if not line.startswith("Engine log ")),
                          known_secrets=known_secrets)
    engine = f"; the engine's last log lines, as the benchmark read them (unverified): {_quoted(tail)}" if tail else ""
    return f"the benchmark says: {reason}: {head}{engine}"
