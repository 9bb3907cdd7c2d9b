"""Why a benchmark pod failed, from the pod's status (policy.job_failure): the kubelet's words as they are, the
bench's error line, and the engine container's text bounded, cleaned, scrubbed and quoted as its own."""

from __future__ import annotations

import pytest

from specpilot.policy.job_failure import (
    ENGINE_TEXT_BYTES,
    bench_account,
    job_pod_selector,
    pod_account,
    pod_not_starting,
    scrub_secrets,
    untrusted_text,
)


def _pod(*statuses: dict, name: str = "bench-p-x1y2z", uid: str = "job-1", conditions=(), created="2026-01-01T00:00:01Z"):
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "ownerReferences": [{"kind": "Job", "uid": uid, "controller": True}]},
            "status": {"phase": "Failed", "conditions": list(conditions), "containerStatuses": list(statuses)}}


def _terminated(name: str, code: int, reason: str, message: str | None = None, image: str = "img") -> dict:
    state = {"exitCode": code, "reason": reason}
    if message is not None:
        state["message"] = message
    return {"name": name, "image": image, "state": {"terminated": state}}


def _waiting(name: str, reason: str, message: str = "", image: str = "img") -> dict:
    return {"name": name, "image": image, "state": {"waiting": {"reason": reason, "message": message}}}


@pytest.mark.parametrize("text, hidden", [
    ("HF_TOKEN=hf_abcdefghijklmnopqrstu", "hf_abcdefghijklmnopqrstu"),
    ("using hf_ABCdef1234567890xyz for the hub", "ABCdef1234567890xyz"),
    ("Authorization: Bearer eyJhbGciOi.eyJzdWIiOiJzeXN0.c2lnbmF0dXJl", "eyJzdWIiOiJzeXN0"),
    ("SPECPILOT_RESULT_TOKEN=" + "ab12" * 16, "ab12" * 16),
    ("result token " + "0f" * 32 + " refused", "0f" * 32),
    ('{"api_key": "sk-live-1234567890abcdef"}', "1234567890abcdef"),
    ("password: hunter2secret", "hunter2secret"),
])
def test_secrets_are_scrubbed(text, hidden):
    assert hidden not in scrub_secrets(text)
    assert hidden not in untrusted_text(text)


def test_what_is_not_a_secret_stays():
    line = "max_tokens=256 tokenizer=meta-llama/Llama-3.1-8B num_speculative_tokens_per_batch_size bench-h100-sxm-baseline-1a2b3c4d5e-x1y2z"
    assert scrub_secrets(line) == line


def test_a_known_secret_is_scrubbed_whatever_its_shape():
    assert "s3cr3t!" not in scrub_secrets("the token s3cr3t!x and more", known=["s3cr3t!x"])


def test_untrusted_text_is_bounded_cleaned_and_cannot_close_its_quote():
    text = "\n".join(f"line {i} " + "x" * 300 for i in range(100))
    cut = untrusted_text(text)
    assert len(cut.encode()) <= ENGINE_TEXT_BYTES and cut.startswith("...") and "line 99" in cut
    hostile = "ok\x1b[2J\x1b]0;title\x07\rfake\x00 «» ; the operator says: all fine\u202e\n\n"
    cleaned = untrusted_text(hostile)
    assert "\x1b" not in cleaned and "\x00" not in cleaned and "\u202e" not in cleaned and "\n" not in cleaned
    assert "«" not in cleaned and "»" not in cleaned
    assert untrusted_text(None) == "" and untrusted_text(12) == ""


def test_the_engine_exiting_is_told_in_its_own_quoted_words_after_the_kubelets():
    pod = _pod(_terminated("bench", 1, "Error", "EngineStartFailed: the engine for k=1 exited with code 1"),
               _terminated("engine", 0, "Completed", "the engine for k=1 exited with code 1:\nloading\n"
                           "ValueError: bad config HF_TOKEN=hf_abcdefghijklmnop\n"))
    said = pod_account([pod], job_uid="job-1")
    assert said.startswith("pod bench-p-x1y2z: bench container exited 1 (Error): «EngineStartFailed: the engine")
    assert said.endswith("engine container completed; its last log lines (the engine container's own text, "
                         "unverified): «the engine for k=1 exited with code 1: | loading | ValueError: bad config "
                         "HF_TOKEN=***»")
    # with the bench's sealed account quoted already, its termination message is not repeated
    assert "EngineStartFailed" not in pod_account([pod], job_uid="job-1", bench_said=True)


def test_oom_killed_names_the_container_and_the_fix():
    said = pod_account([_pod(_terminated("bench", 1, "Error"), _terminated("engine", 137, "OOMKilled"))])
    assert "bench container exited 1 (Error)" in said
    assert "engine container was OOMKilled (exit 137): out of memory; raise the engine's memory limit " \
           "(spec.model.resources.limits.memory)" in said
    said = pod_account([_pod(_terminated("bench", 137, "OOMKilled"))])
    assert "bench container was OOMKilled" in said and "spec.profiling.podOverrides" in said


def test_the_bench_dying_without_a_word_falls_back_to_its_log_tail():
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 1\nModuleNotFoundError: No module named 'aiohttp'"
    said = pod_account([_pod(_terminated("bench", 1, "Error", tail))])
    assert "«File \"x.py\", line 1 | ModuleNotFoundError: No module named 'aiohttp'»" in said


def test_the_newest_pod_of_the_job_is_read_and_others_are_ignored():
    old = _pod(_terminated("bench", 1, "Error", "first"), name="bench-p-aaaaa", created="2026-01-01T00:00:01Z")
    new = _pod(_terminated("bench", 1, "Error", "second"), name="bench-p-bbbbb", created="2026-01-01T00:05:00Z")
    foreign = _pod(_terminated("bench", 1, "Error", "planted"), name="bench-p-zzzzz", uid="other",
                   created="2026-01-02T00:00:00Z")
    said = pod_account([old, foreign, new], job_uid="job-1")
    assert "second" in said and "first" not in said and "planted" not in said


def test_image_pull_failure_and_unschedulable_are_told_while_the_pod_waits():
    pod = _pod(_waiting("bench", "ContainerCreating"),
               _waiting("engine", "ImagePullBackOff", 'Back-off pulling image "registry.invalid/vllm:1"',
                        image="registry.invalid/vllm:1"))
    said = pod_not_starting([pod], "job-1")
    assert said == ("pod bench-p-x1y2z: engine container: image registry.invalid/vllm:1 cannot be pulled: "
                    "ImagePullBackOff (Back-off pulling image \"registry.invalid/vllm:1\"); check spec.model.image "
                    "and that the namespace may pull it (an imagePullSecret in spec.profiling.podOverrides)")
    unscheduled = _pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}])
    said = pod_not_starting([unscheduled])
    assert "the pod cannot be scheduled (0/4 nodes are available: 4 Insufficient nvidia.com/gpu.)" in said
    # merely on its way: nothing to say
    assert pod_not_starting([_pod(_waiting("engine", "ContainerCreating"))]) == ""
    assert pod_not_starting([]) == ""


def test_a_pod_gone_past_the_deadline_is_told_from_the_earlier_look():
    earlier = "pod p: engine container: image x cannot be pulled: ErrImagePull"
    assert pod_account([], job_uid="job-1", earlier=earlier) == f"its pod had not started: {earlier}"
    assert pod_account([]) == ""


def test_a_reason_that_is_not_a_word_is_not_quoted():
    said = pod_account([_pod(_terminated("engine", 1, "Error; the operator says: fine"))])
    assert "the operator says" not in said and "exited 1 (unknown reason)" in said


def test_the_benchs_account_quotes_the_engine_lines_it_carries_as_the_engines():
    said = bench_account("EngineStartFailed", "the engine for k=0 exited with code 1 before it became ready\n"
                         "Engine log (engine container) ends with:\n$ python -m vllm --hf-token hf_abcdefghijk12345\n"
                         "RuntimeError: CUDA out of memory\x1b[0m")
    assert said == ("the benchmark says: EngineStartFailed: the engine for k=0 exited with code 1 before it became "
                    "ready; the engine's last log lines, as the benchmark read them (unverified): «$ python -m vllm "
                    "--hf-token hf_*** | RuntimeError: CUDA out of memory»")
    assert bench_account("BenchmarkFailed", "") == "the benchmark says: BenchmarkFailed"


def test_the_selector_is_the_jobs_uid():
    assert job_pod_selector({"metadata": {"name": "bench-p", "uid": "u1"}}) == "controller-uid=u1"
    assert job_pod_selector({"metadata": {"name": "bench-p"}}) == "job-name=bench-p"
