"""Model shapes: parameter counts, KV bytes, HF config parsing, id resolution, drafters."""

import pytest

from specpilot.perf.models import (
    BUILTIN_MODELS,
    UnknownModelError,
    default_drafter,
    eagle_head,
    from_hf_config,
    medusa_heads,
    mtp_head,
    resolve_model,
)

# meta-llama/Llama-3.1-8B-Instruct config.json (the fields that size the model)
LLAMA_3_1_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def test_from_hf_config_counts_llama_3_1_8b_parameters():
    shape = from_hf_config(LLAMA_3_1_8B_CONFIG, "Llama-3.1-8B")
    assert shape.num_params == pytest.approx(8.03e9, rel=0.02)
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert shape.dtype_bytes == 2
    assert shape == BUILTIN_MODELS["Llama-3.1-8B"]


def test_from_hf_config_defaults_and_errors():
    config = {k: v for k, v in LLAMA_3_1_8B_CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    shape = from_hf_config(config, "mha")
    assert shape.head_dim == 128 and shape.num_kv_heads == 32  # defaults: hidden / heads, MHA
    with pytest.raises(ValueError, match="vocab_size"):
        from_hf_config({k: v for k, v in LLAMA_3_1_8B_CONFIG.items() if k != "vocab_size"}, "broken")
    with pytest.raises(ValueError, match="mixture-of-experts"):
        from_hf_config({**LLAMA_3_1_8B_CONFIG, "num_experts": 64}, "moe")
    nested = from_hf_config({"text_config": LLAMA_3_1_8B_CONFIG}, "wrapped")
    assert nested.num_params == BUILTIN_MODELS["Llama-3.1-8B"].num_params


def test_from_hf_config_tied_qwen3_with_qk_norm():
    config = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    assert from_hf_config(config, "Qwen3-0.6B") == BUILTIN_MODELS["Qwen3-0.6B"]
    with pytest.raises(ValueError, match="torch_dtype"):
        from_hf_config({**config, "torch_dtype": "int4"}, "odd")


@pytest.mark.parametrize(
    ("name", "params"),
    [("Llama-3.1-8B", 8.03e9), ("Llama-3.3-70B", 70.6e9), ("Qwen3-8B", 8.19e9), ("Llama-3.2-1B", 1.24e9),
     ("Qwen3-0.6B", 0.60e9)],
)
def test_builtin_parameter_counts_match_model_cards(name, params):
    assert BUILTIN_MODELS[name].num_params == pytest.approx(params, rel=0.02)


def test_weight_bytes_streamed_and_resident():
    llama = BUILTIN_MODELS["Llama-3.1-8B"]
    assert llama.weight_bytes == llama.num_params * 2
    # an untied input embedding is gathered by rows, not streamed
    assert llama.streamed_weight_bytes == llama.weight_bytes - 128256 * 4096 * 2
    tied = BUILTIN_MODELS["Llama-3.2-1B"]
    assert tied.streamed_weight_bytes == tied.weight_bytes


@pytest.mark.parametrize(
    ("model_id", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("META-LLAMA/LLAMA-3.3-70B-INSTRUCT", "Llama-3.3-70B"),
        ("Qwen/Qwen3-8B", "Qwen3-8B"),
        ("llama-3.2-1b", "Llama-3.2-1B"),
        ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "EAGLE3-LLaMA3.1-Instruct-8B"),
        ("Tengyunw/qwen3_8b_eagle3", "Qwen3-8B-EAGLE3"),
    ],
)
def test_resolve_model(model_id, name):
    assert resolve_model(model_id).name == name


def test_resolve_unknown_model_says_how_to_add_one():
    with pytest.raises(UnknownModelError, match="from_hf_config") as excinfo:
        resolve_model("mistralai/Mistral-7B-Instruct-v0.3")
    assert "Llama-3.1-8B" in str(excinfo.value)


def test_speculative_heads_are_one_layer_of_the_target_width():
    target = BUILTIN_MODELS["Llama-3.1-8B"]
    for head in (eagle_head(target, "eagle"), eagle_head(target, "eagle3"), mtp_head(target)):
        assert head.num_layers == 1 and head.hidden_size == target.hidden_size
        assert head.kv_bytes_per_token == target.kv_bytes_per_token // target.num_layers
        assert head.num_params < target.num_params / 8
    # EAGLE borrows the target's lm head: streamed every pass, not stored twice
    eagle = eagle_head(target, "eagle")
    assert eagle.resident_weight_bytes < eagle.streamed_weight_bytes
    # EAGLE-3 has its own 32k-vocabulary lm head
    assert eagle_head(target, "eagle3").vocab_size == 32000
    medusa = medusa_heads(target, num_heads=4)
    assert medusa.kv_bytes_per_token == 0 and medusa.num_attention_heads == 4
    with pytest.raises(ValueError, match="variant"):
        eagle_head(target, "eagle2")


def test_default_drafters():
    llama = BUILTIN_MODELS["Llama-3.1-8B"]
    assert default_drafter("draft_model", llama).name == "Llama-3.2-1B"
    assert default_drafter("draft_model", BUILTIN_MODELS["Qwen3-8B"]).name == "Qwen3-0.6B"
    assert default_drafter("ngram", llama) is None
    assert default_drafter("eagle3", llama).num_layers == 1
    with pytest.raises(ValueError, match="drafter=from_hf_config"):
        default_drafter("draft_model", from_hf_config({**LLAMA_3_1_8B_CONFIG, "vocab_size": 32000}, "other"))
    with pytest.raises(ValueError, match="unknown speculative method"):
        default_drafter("lookahead", llama)
