"""A model the Hugging Face Hub refuses the engine (policy.model_access): each wording of huggingface_hub,
transformers and vLLM becomes its reason and HTTP status, the drafter is told from the target, any other engine
failure stays what it was, and no text of the engine's reaches the message; the profiling planner fails such a
profile at once, deleting a Job that would retry it; `specpilot validate`'s hint on models likely gated."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api.profile import SpeculationProfileSpec
from specpilot.policy import profiling as pp
from specpilot.policy.model_access import (
    MODEL_ACCESS_DENIED,
    MODEL_NOT_FOUND,
    TOKEN_FIX,
    HubRefusal,
    gated_model_warning,
    hub_refusal,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def spec(model: str = LLAMA, revision: str | None = None, method: dict | None = None) -> SpeculationProfileSpec:
    return SpeculationProfileSpec.model_validate({
        "model": {"id": model, **({"revision": revision} if revision else {})}, "sku": "H100-SXM",
        "engineImage": "vllm/vllm-openai:v0.32.0", "concurrencyLevels": [1, 2], **({"method": method} if method else {})})


EAGLE3_SPEC = spec(method={"method": "eagle3", "model": EAGLE3, "numSpeculativeTokens": 3})

FRAME = ('  File "/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py", line 610, in cached_files\n'
         '    raise OSError(\n')
# vLLM 0.32 on transformers 5 and huggingface_hub 2: the end of its log when the Hub refuses the model's config
# (a gated model, no token). The status is in the last lines.
VLLM_GATED_401 = FRAME + f"""OSError: You are trying to access a gated repo.
Make sure to have access to it at https://huggingface.co/{LLAMA}.
401 Client Error.

Cannot access gated repo for url https://huggingface.co/{LLAMA}/resolve/main/config.json.
Access to model {LLAMA} is restricted. You must have access to it and be authenticated to access it. Please log in."""
VLLM_GATED_403 = VLLM_GATED_401.replace("401 Client", "403 Client").replace(
    "You must have access to it and be authenticated to access it. Please log in.",
    f"is restricted and you are not in the authorized list. Visit https://huggingface.co/{LLAMA} to ask for access.")
# The same failure from older libraries: huggingface_hub 0.2x over requests, with its request id.
HUB_0_GATED_401 = (f"huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6745a1b2-3c4d5e6f7a8b"
                   f"9c0d1e2f3a4b;0f1e2d3c)\n\nCannot access gated repo for url https://huggingface.co/{LLAMA}/resolve/"
                   f"main/config.json.\nAccess to model {LLAMA} is restricted. You must be authenticated to access it.")
# transformers' has_file: no status at all.
TRANSFORMERS_GATED = (f"OSError: {LLAMA} is a gated repository. Make sure to request access at https://huggingface.co/"
                      f"{LLAMA} and pass a token having permission to this repo either by logging in with `hf auth "
                      "login` or by passing `token=<your_token>`.")
# A fine-grained token without access to public gated repositories.
HUB_FORBIDDEN_403 = ("huggingface_hub.errors.HfHubHTTPError: \n\n403 Forbidden: Please enable access to public gated "
                     "repositories in your fine-grained token settings to view this repository..\nCannot access content "
                     f"at: https://huggingface.co/{LLAMA}/resolve/main/config.json.\nMake sure your token has the correct "
                     "permissions.")
REQUESTS_401 = f"requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/api/models/{LLAMA}"
# A repository that does not exist, or is private: the Hub says 401 to a request without a token, 404 with one.
# The status is in huggingface_hub's lines, a traceback above transformers' (the engine supervisor keeps them).
HUB_NOT_FOUND = """huggingface_hub.errors.RepositoryNotFoundError: {status} Client Error.

Repository Not Found for url: https://huggingface.co/{model}/resolve/main/config.json.
Please make sure you specified the correct `repo_id` and `repo_type`.
If you are trying to access a private or gated repo, make sure you are authenticated and your token has the required permissions."""
TRANSFORMERS_NOT_FOUND = """OSError: {model} is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'
If this is a private repository, make sure to pass a token having permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`"""
VLLM_INVALID_REPOSITORY = """ValueError: Invalid repository ID or local directory specified: '{model}'.
Please verify the following requirements:
1. Provide a valid Hugging Face repository ID."""
HUB_REVISION = (f"huggingface_hub.errors.RevisionNotFoundError: 404 Client Error.\n\nRevision Not Found for url: "
                f"https://huggingface.co/{LLAMA}/resolve/v9/config.json.\nInvalid rev id: v9")
TRANSFORMERS_REVISION = ("OSError: v9 is not a valid git identifier (branch name, tag name or commit id) that exists for "
                         f"this model name. Check the model page at 'https://huggingface.co/{LLAMA}' for available "
                         "revisions.")


@pytest.mark.parametrize("texts, reason, kind, status", [
    ([VLLM_GATED_401], MODEL_ACCESS_DENIED, "gated", 401),
    ([VLLM_GATED_403], MODEL_ACCESS_DENIED, "gated", 403),
    ([HUB_0_GATED_401], MODEL_ACCESS_DENIED, "gated", 401),
    ([TRANSFORMERS_GATED], MODEL_ACCESS_DENIED, "gated", None),
    ([HUB_FORBIDDEN_403], MODEL_ACCESS_DENIED, "forbidden", 403),
    ([REQUESTS_401], MODEL_ACCESS_DENIED, "forbidden", 401),
    ([HUB_NOT_FOUND.format(status=404, model=LLAMA) + "\n...\n" + TRANSFORMERS_NOT_FOUND.format(model=LLAMA)],
     MODEL_NOT_FOUND, "repository", 404),
    ([HUB_NOT_FOUND.format(status=401, model=LLAMA)], MODEL_NOT_FOUND, "repository", 401),
    ([TRANSFORMERS_NOT_FOUND.format(model=LLAMA)], MODEL_NOT_FOUND, "repository", None),
    # the bench's account (the tail only) and the engine container's message (the Hub's lines kept above it)
    ([TRANSFORMERS_NOT_FOUND.format(model=LLAMA), HUB_NOT_FOUND.format(status=404, model=LLAMA)],
     MODEL_NOT_FOUND, "repository", 404),
    ([HUB_NOT_FOUND.format(status=404, model=LLAMA) + "\n\n" + VLLM_INVALID_REPOSITORY.format(model=LLAMA)],
     MODEL_NOT_FOUND, "repository", 404),
    ([HUB_REVISION + "\n" + TRANSFORMERS_REVISION], MODEL_NOT_FOUND, "revision", 404),
    ([TRANSFORMERS_REVISION], MODEL_NOT_FOUND, "revision", None),
])
def test_each_wording_is_its_reason_and_status(texts, reason, kind, status):
    refused = hub_refusal(texts, spec(revision="v9"))
    assert refused is not None
    assert (refused.reason, refused.kind, refused.status, refused.model, refused.method) == (
        reason, kind, status, LLAMA, None)


@pytest.mark.parametrize("text", [
    "",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB",
    "ValueError: --max-num-seqs must be >= 1 (got 0)",
    "ValueError: Speculative method eagle9 is not supported",
    # no network, a rate limit, a server error: not the model's access, and a retry may mend them
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
    "files.",
    f"huggingface_hub.errors.HfHubHTTPError: 429 Too Many Requests for url: https://huggingface.co/{LLAMA}.",
    f"requests.exceptions.HTTPError: 500 Server Error: Internal Server Error for url: https://huggingface.co/{LLAMA}",
    # a file the repository does not hold is not a missing model
    f"huggingface_hub.errors.EntryNotFoundError: 404 Client Error.\n\nEntry Not Found for url: https://huggingface.co/"
    f"{LLAMA}/resolve/main/tokenizer.json.",
    # vLLM's wrapper alone says nothing of the Hub's answer (it wraps a lost connection the same way)
    VLLM_INVALID_REPOSITORY.format(model=LLAMA),
    # an HTTP error of something else the engine calls
    "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://weights.internal/llama.tar",
])
def test_any_other_engine_failure_stays_what_it_was(text):
    assert hub_refusal([text], spec()) is None


def test_a_profile_without_its_spec_is_not_judged():
    assert hub_refusal([VLLM_GATED_401], None) is None


def test_the_drafter_is_named_when_the_hubs_answer_names_it_and_not_the_target():
    drafter = VLLM_GATED_401.replace(LLAMA, EAGLE3)
    # vLLM's start-up lines name both models; only the lines with the Hub's answer count
    text = f"non-default args: {{'model': '{LLAMA}', 'speculative_config': {{'model': '{EAGLE3}'}}}}\n{drafter}"
    refused = hub_refusal([text], EAGLE3_SPEC)
    assert (refused.model, refused.method, refused.status) == (EAGLE3, "eagle3", 401)
    assert refused.message.startswith(f"the engine could not download the drafter {EAGLE3} of method eagle3 from "
                                      "Hugging Face (HTTP 401): it is gated, and the engine had no valid token: set "
                                      "spec.model.hfTokenSecretRef")
    assert hub_refusal([VLLM_GATED_401], EAGLE3_SPEC).model == LLAMA
    missing = hub_refusal([HUB_NOT_FOUND.format(status=404, model=EAGLE3)], EAGLE3_SPEC)
    assert missing.message == (f"the engine could not download the drafter {EAGLE3} of method eagle3 from Hugging "
                               "Face (HTTP 404): no such repository: check spec.methods[].model of method eagle3")


def test_a_drafter_whose_id_extends_the_targets_is_told_apart():
    """`org/model-eagle3` holds `org/model`: an id counts whole, and a sentence's full stop after it ends it."""
    family = spec(model="acme/model", method={"method": "eagle3", "model": "acme/model-eagle3"})
    assert hub_refusal([HUB_NOT_FOUND.format(status=404, model="acme/model-eagle3")], family).model == "acme/model-eagle3"
    assert hub_refusal([TRANSFORMERS_GATED.replace(LLAMA, "acme/model")], family).model == "acme/model"
    ends = "Make sure to have access to it at https://huggingface.co/acme/model-eagle3.\n401 Client Error. gated repo"
    assert hub_refusal([ends.replace("gated repo", "Cannot access gated repo")], family).model == "acme/model-eagle3"


@pytest.mark.parametrize("refused, says", [
    (HubRefusal("gated", 401, LLAMA), [f"the model {LLAMA}", "(HTTP 401)", TOKEN_FIX, "the token in the Secret is "
                                       "not valid"]),
    (HubRefusal("gated", 403, LLAMA), ["(HTTP 403)", "has no access to it", f"terms on huggingface.co/{LLAMA}"]),
    (HubRefusal("gated", None, LLAMA), ["(no HTTP status in the engine's log)", TOKEN_FIX]),
    (HubRefusal("repository", 401, LLAMA), ["(HTTP 401)", "or a private one", "check spec.model.id", TOKEN_FIX]),
    (HubRefusal("repository", 404, LLAMA), ["(HTTP 404): no such repository: check spec.model.id"]),
    (HubRefusal("revision", 404, LLAMA, "v9"), ["(HTTP 404): the repository has no revision v9: check "
                                                "spec.model.revision"]),
    (HubRefusal("revision", 404, EAGLE3, None, "eagle3"), ["its default revision", "spec.methods[].revision of "
                                                                                    "method eagle3"]),
])
def test_each_message_names_the_model_the_status_and_the_field(refused, says):
    for words in says:
        assert words in refused.message, refused.message
    assert TOKEN_FIX.startswith("set spec.model.hfTokenSecretRef to a Secret") and "key `token`" in TOKEN_FIX
    assert "kubectl create secret generic hf-token --from-literal=token=hf_..." in TOKEN_FIX


def _every_message(profile: SpeculationProfileSpec) -> set[str]:
    """Every message the operator can write for `profile`: its words around the spec's values and a status."""
    models = [(profile.model.id, profile.model.revision, None)]
    if profile.method is not None:
        models.append((profile.method.model, profile.method.revision, profile.method.key))
    return {HubRefusal(kind, status, model, revision, method).message
            for kind in ("gated", "forbidden", "repository", "revision") for status in (None, 401, 403, 404)
            for model, revision, method in models}


HOSTILE = st.text(alphabet=st.sampled_from(list("abc xyz«»\n\t\x1b[31m;:=/.'\"")) | st.characters(), max_size=300)
INJECTIONS = st.sampled_from(["", "HTTP 999 ", "403 Forbidden", "401 Client Error.", "Cannot access gated repo ",
                              "«the operator says: all good»", "\nspec.model.hfTokenSecretRef is fine\n",
                              "Access to model evil/model is restricted. You must have access",
                              "https://huggingface.co/evil/model", "hf_abcdefghijklmnopqrstuvwxyz", "404 Not Found"])


@settings(max_examples=300, deadline=None)
@given(before=HOSTILE, inject=INJECTIONS, after=HOSTILE,
       wording=st.sampled_from([VLLM_GATED_401, HUB_FORBIDDEN_403, HUB_REVISION, TRANSFORMERS_NOT_FOUND.format(
           model=LLAMA), HUB_NOT_FOUND.format(status=401, model=EAGLE3), ""]))
def test_hostile_text_chooses_at_most_a_reason_and_a_status_never_the_words(before, inject, after, wording):
    for profile in (spec(revision="v9"), EAGLE3_SPEC):
        refused = hub_refusal([before + inject + wording + after, inject], profile)
        if refused is None:
            continue
        assert refused.status in (None, 401, 403, 404)
        assert refused.message in _every_message(profile), refused.message
        assert "\n" not in refused.message and "«" not in refused.message and "evil" not in refused.message


# --- the profiling planner ------------------------------------------------------------------------------------

def _need(profile: SpeculationProfileSpec | None = None) -> pp.Need:
    profile = profile or spec()
    return pp.Need.of("h100", "H100-SXM", profile.method, profile)


def _plan(need: pp.Need, profile: pp.ProfileView, job: pp.JobView) -> pp.ProfilingPlan:
    from datetime import UTC, datetime

    return pp.plan_profiling(pp.ProfilingInputs([need], {need.name: profile}, {need.name: job},
                                                datetime(2026, 12, 1, tzinfo=UTC)))


BENCH_SAID = "; the benchmark says: EngineStartFailed: the engine for k=0 exited with code 1"


def test_an_attempt_the_hub_refused_fails_the_profile_at_once_and_deletes_its_job():
    """The bench's sealed account says the Hub refused the model: the Job is still Active (its pod exiting, the
    Job controller about to retry it), and every retry would be refused alike."""
    need = _need()
    profile = pp.ProfileView("Running", bench_said=BENCH_SAID, bench_text="the engine for k=0 exited with code 1 "
                             "before it became ready\nEngine log (engine container) ends with:\n" + VLLM_GATED_401)
    result = _plan(need, profile, pp.JobView("bench-x", "Active", active=0, failed=0))
    [mark] = result.of(pp.MarkFailed)
    assert result.states[need.name] == "Failed"
    assert (mark.reason, mark.delete_job, mark.attempts) == (MODEL_ACCESS_DENIED, "bench-x", 1)
    assert mark.message.startswith(f"the engine could not download the model {LLAMA} from Hugging Face (HTTP 401): "
                                   "it is gated, and the engine had no valid token: set spec.model.hfTokenSecretRef")
    assert "; not retried (its Job is deleted): each retry would be refused" in mark.message
    assert mark.message.endswith(f"{BENCH_SAID}; a change of the spec measures it again (a fix outside the spec: "
                                 f"{pp.RETRY_HINT})")
    assert mark.event_message.startswith(f"{MODEL_ACCESS_DENIED}: the engine could not download the model {LLAMA} "
                                         "from Hugging Face (HTTP 401)")
    assert not result.of(pp.RecordRetry)


def test_a_job_that_failed_for_good_on_the_hubs_refusal_gets_its_reason():
    """The bench could not say (it never published): the engine container's own message, read from the pod."""
    need = _need()
    engine = "the engine for k=0 exited with code 1; the Hugging Face Hub's answer, earlier in its log:\n" + \
        HUB_NOT_FOUND.format(status=404, model=LLAMA) + "\nits log ends with:\n" + TRANSFORMERS_NOT_FOUND.format(model=LLAMA)
    job = pp.JobView("bench-x", "Failed", failed=3, failure=("BackoffLimitExceeded", "too many"),
                     pods_said="pod bench-x-1: engine container exited 1 (Error)", engine_text=engine)
    [mark] = _plan(need, pp.ProfileView("Running"), job).of(pp.MarkFailed)
    assert (mark.reason, mark.delete_job, mark.attempts) == (MODEL_NOT_FOUND, None, 3)
    assert mark.message.startswith(f"the engine could not download the model {LLAMA} from Hugging Face (HTTP 404): "
                                   "no such repository: check spec.model.id; each retry would be refused")
    assert "; pod bench-x-1: engine container exited 1 (Error); a change of the spec measures it again" in mark.message


@pytest.mark.parametrize("job, profile, expected", [
    # another engine failure: retried by the Job, then reported with the Job's reason, as before
    (pp.JobView("bench-x", "Active", active=1, failed=1), pp.ProfileView("Running", bench_text="CUDA out of memory"),
     "RecordRetry"),
    (pp.JobView("bench-x", "Failed", failed=3, failure=("BackoffLimitExceeded", "too many"),
                engine_text="CUDA out of memory"), pp.ProfileView("Running"), "BackoffLimitExceeded"),
    # a Job that completed measured the model: an earlier attempt's account does not fail it
    (pp.JobView("bench-x", "Complete"), pp.ProfileView("Running", bench_text=VLLM_GATED_401), "Wait"),
])
def test_other_failures_follow_the_job_as_before(job, profile, expected):
    result = _plan(_need(), profile, job)
    marks = result.of(pp.MarkFailed)
    assert (marks[0].reason if marks else type(result.actions[-1]).__name__) == expected
    assert all(m.delete_job is None for m in marks)


def test_a_need_without_its_spec_is_followed_as_before():
    need = pp.Need("p", "h100", "baseline", "H100-SXM")
    result = _plan(need, pp.ProfileView("Running", bench_text=VLLM_GATED_401), pp.JobView("bench-x", "Active", active=1))
    assert not result.of(pp.MarkFailed)


# --- specpilot validate's hint ----------------------------------------------------------------------------------

def _deployment(model: str, methods: list[dict] | None = None, token: bool = False) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": model, **({"hfTokenSecretRef": {"name": "hf-token"}} if token else {})},
        "methods": methods or [{"method": "ngram"}], "gpuPools": [{"name": "a", "nodeSelector": {"gpu": "h100"}}]})


@pytest.mark.parametrize("model, methods, named", [
    (LLAMA, None, [f"spec.model.id {LLAMA} (meta-llama gates its models)"]),
    ("mistralai/Mistral-7B-Instruct-v0.3", None, ["mistralai gates its models"]),
    ("Qwen/Qwen3-8B", [{"method": "draft_model", "model": "google/gemma-3-1b-it"}],
     ["spec.methods[0].model google/gemma-3-1b-it (google gates its Gemma models)"]),
    ("CohereLabs/c4ai-command-r7b-12-2024", None, ["CohereLabs gates its models"]),
])
def test_a_model_of_an_organisation_that_gates_its_models_without_a_token_is_a_warning(model, methods, named):
    warning = gated_model_warning(_deployment(model, methods))
    for words in named:
        assert words in warning, warning
    assert "a hint from the organisation's name, not a lookup" in warning
    assert f"{MODEL_ACCESS_DENIED} (HTTP 401): {TOKEN_FIX}" in warning
    assert gated_model_warning(_deployment(model, methods, token=True)) is None


@pytest.mark.parametrize("model, methods", [
    ("Qwen/Qwen3-8B", None),
    ("google/t5-v1_1-xl", None),  # google gates Gemma, not every model of its
    ("/models/meta-llama/Llama-3.1-8B-Instruct", None),  # a path in the image, not a Hub id
    ("acme/meta-llama", None),  # the organisation is the part before the slash
    ("Qwen/Qwen3-8B", [{"method": "eagle3", "model": EAGLE3}]),
])
def test_other_models_get_no_warning(model, methods):
    assert gated_model_warning(_deployment(model, methods)) is None


@pytest.mark.parametrize("reason, spec_changed, restarted", [
    ("ModelAccessDenied", True, True),    # a token set, or the model mended: measured again
    ("ModelNotFound", True, True),
    ("ModelAccessDenied", False, False),  # nothing changed: a retry would be refused the same way
    ("OOMKilled", True, False),           # another failure waits for the annotation, as before
])
def test_a_profile_the_hub_refused_is_measured_again_once_the_spec_changes(reason, spec_changed, restarted):
    from datetime import UTC, datetime

    need = _need()
    failed = pp.ProfileView("Failed", verdict=True, failure_reason=reason, reprofile_mark="1")
    plan = pp.plan_profiling(pp.ProfilingInputs([need], {need.name: failed}, {}, datetime(2026, 12, 1, tzinfo=UTC),
                                                spec_changed=spec_changed))
    restarts = [a for a in plan.actions if isinstance(a, pp.Restart)]
    assert bool(restarts) is restarted
    if restarted:
        (restart,) = restarts
        assert reason in restart.why and "spec changed" in restart.why
        assert restart.reprofile == "1"  # the annotation's value is kept: no second restart by it
