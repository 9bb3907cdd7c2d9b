"""Acceptance priors: shape of the vectors, tokens per step, prefix truncation."""

import pytest

from specpilot.perf.acceptance import (
    METHODS,
    WORKLOADS,
    AcceptanceProfile,
    acceptance_profile,
    expected_tokens_per_step,
)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_vectors_are_non_increasing_probabilities(method, workload):
    profile = acceptance_profile(method, workload, max_k=16)
    assert len(profile.per_position) == 16
    assert all(0.0 <= p <= 1.0 for p in profile.per_position)
    assert all(a >= b for a, b in zip(profile.per_position, profile.per_position[1:]))
    assert 0.0 < profile.drafts_per_step <= 1.0


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "medusa", "mtp"])
def test_model_drafters_always_draft(method):
    assert acceptance_profile(method, "sharegpt", 4).drafts_per_step == 1.0


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_lookup_drafters_draft_only_on_a_match_and_love_extraction(method):
    chat = acceptance_profile(method, "sharegpt", 5)
    extraction = acceptance_profile(method, "json-extraction", 5)
    random = acceptance_profile(method, "random", 5)
    assert chat.drafts_per_step < 1.0
    assert random.drafts_per_step < chat.drafts_per_step < extraction.drafts_per_step
    assert expected_tokens_per_step(extraction, 5) > expected_tokens_per_step(chat, 5) + 1.0


def test_eagle3_beats_eagle_and_code_beats_chat():
    for k in (2, 3, 5):
        assert (acceptance_profile("eagle3", "sharegpt", k).tokens_per_step(k)
                > acceptance_profile("eagle", "sharegpt", k).tokens_per_step(k))
        assert (acceptance_profile("eagle3", "humaneval", k).tokens_per_step(k)
                > acceptance_profile("eagle3", "sharegpt", k).tokens_per_step(k))


def test_published_anchors():
    # DeepSeek-V3: the MTP token is accepted 85-90% of the time
    assert 0.85 <= acceptance_profile("mtp", "sharegpt", 1).per_position[0] <= 0.90
    # vLLM #20780, EAGLE-3 on Llama-3.1-8B, MT-bench: acceptance length 2.79 at k = 3
    assert acceptance_profile("eagle3", "json-extraction", 3).tokens_per_step(3) == pytest.approx(2.79, abs=0.05)


def test_expected_tokens_per_step_formula():
    profile = AcceptanceProfile((0.8, 0.5, 0.2), drafts_per_step=0.5)
    assert expected_tokens_per_step(profile, 0) == 1.0
    assert expected_tokens_per_step(profile, 2) == pytest.approx(1 + 0.5 * 1.3)
    assert profile.tokens_per_step(3) == pytest.approx(1.75)
    assert profile.truncated(2).per_position == (0.8, 0.5)
    with pytest.raises(ValueError, match="k must be within 0..3"):
        expected_tokens_per_step(profile, 4)


def test_max_k_beyond_the_table_extends_geometrically():
    profile = acceptance_profile("eagle3", "sharegpt", 12)
    tail = profile.per_position[7:]
    ratios = {round(b / a, 9) for a, b in zip(tail, tail[1:])}
    assert len(ratios) == 1 and ratios.pop() < 1.0
    assert acceptance_profile("eagle3", "sharegpt", 0).per_position == ()


def test_profile_validation():
    with pytest.raises(ValueError, match="non-increasing"):
        AcceptanceProfile((0.5, 0.6))
    with pytest.raises(ValueError, match=r"per_position\[0\]"):
        AcceptanceProfile((1.2,))
    with pytest.raises(ValueError, match="drafts_per_step"):
        AcceptanceProfile((0.5,), drafts_per_step=0.0)
    with pytest.raises(ValueError, match="unknown workload 'chat'.*sharegpt"):
        acceptance_profile("eagle3", "chat", 3)
    with pytest.raises(ValueError, match="unknown speculative method 'lookahead'"):
        acceptance_profile("lookahead", "sharegpt", 3)
