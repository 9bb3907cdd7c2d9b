"""Results only a profile's own benchmark Job can write (api.seal)."""

from __future__ import annotations

import json

from specpilot.api import seal

KEY = b"k" * 32
STATUS = {"phase": "Succeeded", "completedAt": "2026-11-29T00:00:00Z", "kvCapacityTokens": 100000,
          "runs": [{"numSpeculativeTokens": 0, "points": [{"concurrency": 1, "outputThroughput": 2.0,
                                                           "tpotMs": {"mean": 0.00001, "p95": 12.5}}]}]}


def _profile(name="p", nonce="n1", status=STATUS, token_nonce=None, namespace="team"):
    token = seal.job_token(KEY, namespace, name, token_nonce or nonce)
    return {"metadata": {"name": name, "annotations": {seal.NONCE_ANNOTATION: nonce}},
            "status": {**status, "seal": seal.seal(token, status)}}


def test_the_profiles_own_job_seals_a_result_the_operator_accepts():
    assert seal.seal_problem(KEY, "team", _profile()) is None


def test_the_seal_survives_the_api_servers_json_round_trip():
    # Go re-encodes 2.0 as 2 and 1e-05 as 0.00001; nulls may be dropped.
    profile = _profile()
    text = json.dumps(profile).replace("2.0", "2").replace("1e-05", "0.00001")
    round_tripped = json.loads(text)
    round_tripped["status"]["validation"] = None
    assert seal.seal_problem(KEY, "team", round_tripped) is None


def test_a_result_from_anyone_else_is_refused_naming_why():
    other_job = _profile(token_nonce="n0")  # an earlier Job of the same profile, or a forged token
    assert "does not match" in seal.seal_problem(KEY, "team", other_job)
    other_profile = _profile(name="q")
    other_profile["metadata"]["name"] = "p"  # another profile's Job wrote it
    assert "does not match" in seal.seal_problem(KEY, "team", other_profile)
    other_namespace = _profile(namespace="other")
    assert "does not match" in seal.seal_problem(KEY, "team", other_namespace)
    assert "does not match" in seal.seal_problem(b"x" * 32, "team", _profile())
    tampered = _profile()
    tampered["status"]["runs"][0]["points"][0]["outputThroughput"] = 2000.0
    assert "does not match" in seal.seal_problem(KEY, "team", tampered)
    unsealed = _profile()
    del unsealed["status"]["seal"]
    assert "no seal" in seal.seal_problem(KEY, "team", unsealed)
    no_nonce = _profile()
    del no_nonce["metadata"]["annotations"][seal.NONCE_ANNOTATION]
    assert "no result nonce" in seal.seal_problem(KEY, "team", no_nonce)


def test_fields_outside_the_result_do_not_break_the_seal():
    profile = _profile()
    profile["status"].update(phase="Succeeded", reason="JobCreated", attempts=2, jobName="bench-p")
    assert seal.seal_problem(KEY, "team", profile) is None


def test_a_refinement_round_may_seal_beside_the_measurement():
    measured = _profile(nonce="n1 n2", token_nonce="n1")
    refined = _profile(nonce="n1 n2", token_nonce="n2")
    assert seal.seal_problem(KEY, "team", measured) is None and seal.seal_problem(KEY, "team", refined) is None
    assert "does not match" in seal.seal_problem(KEY, "team", _profile(nonce="n1 n2 n3", token_nonce="n3"))
