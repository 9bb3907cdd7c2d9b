"""Whether a benchmark's engine could not download its model from Hugging Face, from what it printed; and which
models likely need a token before anything runs. Pure.

A gated model (Llama, Gemma, most of Mistral's) downloads only with the token of an account that accepted its
terms, and a private or misspelt one not at all. Without `spec.model.hfTokenSecretRef` the engine stops at its
first request to the Hub, and every retry of the Job stops there again: nothing but a change to the spec or the
token mends it. So a profile whose engine says so fails at once, with its own reason and a message naming the
model and the field that fixes it (`hub_refusal`), instead of a generic engine-start failure after the Job's
retries.

The engine's text is the tenant's (its image, its code), and untrusted. It only chooses among the reasons below
and gives the HTTP status, read as one of 401, 403 and 404; the message is the operator's words around what the
spec says (the model id, its revision, the method), never the engine's. At worst a tenant's engine fails its own
profile with the wrong one of these reasons, which it could fail anyway.

`gated_model_warning` is `specpilot validate`'s hint that a model of an organisation that gates its models is
named without a token: a short list of organisations (GATED_ORGANISATIONS), not a lookup on the Hub, so an open
model of theirs gets the hint too and a gated model of anyone else's does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..api.profile import SpeculationProfileSpec

__all__ = [
    "GATED_ORGANISATIONS",
    "MODEL_ACCESS_DENIED",
    "MODEL_NOT_FOUND",
    "TOKEN_FIX",
    "HubRefusal",
    "gated_model_warning",
    "hub_refusal",
]

MODEL_ACCESS_DENIED = "ModelAccessDenied"
"""The Hub refused the download (HTTP 401 or 403): a gated or private model and no valid token, or a token whose
account has no access."""
MODEL_NOT_FOUND = "ModelNotFound"
"""The Hub has no such repository (404; 401 for one that may also be private) or no such revision of it."""

TOKEN_FIX = ("set spec.model.hfTokenSecretRef to a Secret holding a Hugging Face token of an account granted "
             "access, under the key `token` (or the key hfTokenSecretRef.key names): `kubectl create secret generic "
             "hf-token --from-literal=token=hf_...`, then `hfTokenSecretRef: {name: hf-token}` (a Secret the "
             "operator config's tenancy.allowedSecretNames allows; hf-token by default)")
"""How a deployment gives its engines a Hugging Face token (the engine reads it as HF_TOKEN for every download,
the drafter's too)."""

GATED_ORGANISATIONS: dict[str, str] = {
    "meta-llama": "",
    "mistralai": "",
    "google": "gemma",
    "coherelabs": "",
    "cohereforai": "",
}
"""Hugging Face organisations (lowercase) that gate their models, with a word the model's name must hold ("": any
model of theirs): Meta's Llama, Mistral AI's, Google's Gemma, Cohere's Command (CohereForAI is Cohere Labs' old
name). A hint for `specpilot validate`, kept short on purpose: the Hub is the registry, and this is no lookup."""

TEXT_CHARS = 16384
"""The end of each text read: a termination message is at most 4 KiB, the bench's account 8 KiB."""

_STATUS = re.compile(r"\b(40[134]) (?:Client Error|Unauthorized|Forbidden|Not Found)\b")
# huggingface_hub's own errors ("401 Client Error.", GatedRepoError, RepositoryNotFoundError, ...), transformers'
# OSErrors around them and the Hub's answer they quote; "a private or gated repo" (the Hub's advice on a missing
# repository) is not the gated wording.
_GATED = re.compile(r"Cannot access gated repo|trying to access a gated repo|is a gated repository|GatedRepoError|"
                    r"is restricted and you are not in the authorized list|is restricted\. You must have access")
_REVISION = re.compile(r"Revision Not Found|RevisionNotFoundError|is not a valid git identifier")
_REPOSITORY = re.compile(r"Repository Not Found|RepositoryNotFoundError|is not a valid model identifier|"
                         r"is not a local folder or a valid repository name")
_HUB = re.compile(r"huggingface|HfHubHTTPError")
"""A bare 401 or 403 counts only beside a sign of the Hub (its URL, its client's module or error type): an engine
plugin's own HTTP error is not a model download."""

GATED, FORBIDDEN, REPOSITORY, REVISION = "gated", "forbidden", "repository", "revision"
_STATUSES = {GATED: (401, 403), FORBIDDEN: (401, 403), REPOSITORY: (401, 404), REVISION: (404,)}
"""The HTTP statuses each refusal comes with; another status in the text is not this refusal's."""


@dataclass(frozen=True)
class HubRefusal:
    """The Hub refused the engine a model the spec names. Every word of `message` is the operator's or the
    spec's: the kind and the status were read from the engine's text, nothing of it is quoted."""

    kind: str
    """gated (a gated model, no access), forbidden (401/403 without the gated wording), repository (no such
    repository, or a private one) or revision (no such revision)."""
    status: int | None
    """The HTTP status the engine's text gave (401, 403 or 404), None when it gave none."""
    model: str
    """The model refused: the spec's id of the target or the drafter."""
    revision: str | None = None
    """The spec's revision of that model."""
    method: str | None = None
    """The method whose drafter it is (its key); None for the target model."""

    @property
    def reason(self) -> str:
        return MODEL_NOT_FOUND if self.kind in (REPOSITORY, REVISION) else MODEL_ACCESS_DENIED

    @property
    def message(self) -> str:
        """What was refused, the HTTP status, and the field that fixes it."""
        if self.method is None:
            what, id_field, revision_field = f"the model {self.model}", "spec.model.id", "spec.model.revision"
        else:
            what = f"the drafter {self.model} of method {self.method}"
            id_field = f"spec.methods[].model of method {self.method}"
            revision_field = f"spec.methods[].revision of method {self.method}"
        status = f"HTTP {self.status}" if self.status is not None else "no HTTP status in the engine's log"
        head = f"the engine could not download {what} from Hugging Face ({status})"
        if self.kind == REVISION:
            revision = f"revision {self.revision}" if self.revision else "its default revision"
            return f"{head}: the repository has no {revision}: check {revision_field} (a branch, tag or commit)"
        if self.kind == REPOSITORY:
            if self.status == 404:
                return f"{head}: no such repository: check {id_field}"
            return (f"{head}: no such repository, or a private one and the engine had no valid token: check "
                    f"{id_field}, or, if it is private, {TOKEN_FIX}")
        gated = "it is gated, and " if self.kind == GATED else ""
        if self.status == 403:
            return (f"{head}: {gated}the token in spec.model.hfTokenSecretRef has no access to it: accept the model's "
                    f"terms on huggingface.co/{self.model} with the token's account (a fine-grained token must also "
                    f"be allowed to read gated repositories), or put a token that has access in that Secret")
        if self.status == 401:
            return (f"{head}: {gated}the engine had no valid token: {TOKEN_FIX}; if it is set, the token in the Secret "
                    f"is not valid")
        return (f"{head}: {gated}access was refused: {TOKEN_FIX}; if it is set, accept the model's terms on "
                f"huggingface.co/{self.model} with the token's account")


def _mentions(text: str, model: str) -> bool:
    """Whether `text` names `model` as a whole id (not `org/name` inside `org/name-eagle3`; a sentence's full stop
    after it is not part of it)."""
    return re.search(rf"(?<![\w.-]){re.escape(model)}(?![\w-]|\.[\w-])", text) is not None


def _kind(text: str) -> str | None:
    if _GATED.search(text):
        return GATED
    if _REVISION.search(text):
        return REVISION
    if _REPOSITORY.search(text):
        return REPOSITORY
    if any(m.group(1) in ("401", "403") for m in _STATUS.finditer(text)) and _HUB.search(text):
        return FORBIDDEN
    return None


def hub_refusal(texts: Iterable[str], spec: SpeculationProfileSpec | None) -> HubRefusal | None:
    """Whether the engine's `texts` (the bench's sealed account of it, the engine container's termination message;
    untrusted) say the Hugging Face Hub refused a model of the profile `spec`: which kind of refusal, the HTTP
    status (the last one of that kind's in the text), and whether the method's drafter was refused rather than the
    target: when the lines carrying the Hub's answer name the drafter's id and not the target's.
    None: not a refusal of the Hub's (any other failure stays what it was), or no spec to name the model by."""
    if spec is None:
        return None
    text = "\n".join(t[-TEXT_CHARS:] for t in texts if isinstance(t, str) and t)
    kind = _kind(text)
    if kind is None:
        return None
    statuses = [int(m.group(1)) for m in _STATUS.finditer(text) if int(m.group(1)) in _STATUSES[kind]]
    evidence = "\n".join(line for line in text.splitlines()
                         if _STATUS.search(line) or _GATED.search(line) or _REVISION.search(line)
                         or _REPOSITORY.search(line) or "huggingface.co/" in line)
    drafter = spec.method.model if spec.method is not None else None
    if drafter and drafter != spec.model.id and _mentions(evidence, drafter) and not _mentions(evidence, spec.model.id):
        return HubRefusal(kind, statuses[-1] if statuses else None, drafter, spec.method.revision, spec.method.key)
    return HubRefusal(kind, statuses[-1] if statuses else None, spec.model.id, spec.model.revision)


def _gating(model: str | None) -> str | None:
    """Which organisation of GATED_ORGANISATIONS gates the Hugging Face id `org/name` (with the family it gates,
    where it names one), as words; None when none does. A local path is not an id."""
    if not model or model.startswith(("/", ".")) or model.count("/") != 1:
        return None
    org, name = model.split("/")
    family = GATED_ORGANISATIONS.get(org.lower())
    if family is None or family not in name.lower():
        return None
    return f"{org} gates its {family.capitalize() + ' ' if family else ''}models"


def gated_model_warning(spec: SpeculativeDeploymentSpec) -> str | None:
    """`specpilot validate`'s warning for a spec that names models of organisations that gate theirs
    (GATED_ORGANISATIONS: a hint, not a lookup on the Hub) without a Hugging Face token: its benchmark Jobs would
    fail with ModelAccessDenied. None when spec.model.hfTokenSecretRef is set (the engine's one token serves the
    drafters too) or no model is named so."""
    if spec.model.hf_token_secret_ref is not None:
        return None
    named = [("spec.model.id", spec.model.id)] + [(f"spec.methods[{i}].model", m.model)
                                                    for i, m in enumerate(spec.methods)]
    gated = [f"{field} {model} ({why})" for field, model in named if (why := _gating(model))]
    if not gated:
        return None
    return (f"likely gated on Hugging Face (a hint from the organisation's name, not a lookup), and "
            f"spec.model.hfTokenSecretRef is not set: {', '.join(gated)}. If gated, the benchmark Jobs fail with "
            f"{MODEL_ACCESS_DENIED} (HTTP 401): {TOKEN_FIX}")
