"""Tiny local models for running the real vLLM engine on a CPU: a target Llama with a drafter for every
model-based speculative method the CPU engine runs.

No download: a ByteLevel BPE tokenizer trained on Python's own standard-library sources and a 4-layer Llama
with random weights (head_dim 64, which the CPU attention backend accepts). Random weights loop on a few
tokens, often repeating the last one, so n-gram acceptance comes out near 100%: right for testing
mechanics, meaningless as a measurement. Beside it, all sharing the tokenizer:

- `draft`: a 2-layer random Llama, for `draft_model`;
- `eagle3`: a one-layer EAGLE-3 head for the target (`LlamaForCausalLMEagle3`), for `eagle3`;
- `medusa`: four Medusa heads for the target (`MedusaModel`), for `medusa`;
- `mtp_target`: a second target, MiMo-shaped (a Qwen2 with one MTP layer, `MiMoForCausalLM`), for `mtp`:
  a Llama has no MTP layer, and MTP drafts with layers shipped inside the target.

The drafters' weights are set by hand, not drawn: random drafters draft tokens the target almost never
accepts, which leaves the acceptance counters at zero. The EAGLE-3 head looks up what followed its input
token earlier in the sequence (an induction head, see `_eagle3_head`); the Medusa heads and the MTP layer
draft the target's last token again. Both are accepted when the target loops, less at each later
position, as a trained drafter is, so the per-position counters move.

`build_tiny_models(cache_dir)` builds them once (about 10 s) and reuses them while the recipe is unchanged.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

RECIPE_VERSION = "3"
"""Bump when the recipe changes so cached builds are rebuilt."""

VOCAB_SIZE = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]


@dataclass(frozen=True)
class TinyModels:
    """Where the built models live (each a directory with weights, config and tokenizer)."""

    target: Path
    """The target Llama."""
    draft: Path
    """The draft Llama for `draft_model`."""
    eagle3: Path
    """The EAGLE-3 head for `target`, for `eagle3`."""
    medusa: Path
    """The Medusa heads for `target`, for `medusa`."""
    mtp_target: Path
    """A MiMo-shaped target with one MTP layer, for `mtp` (serve it as the model; the method needs no `model`)."""


def _training_text() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:200]
    return [f.read_text(encoding="utf-8", errors="ignore") for f in files]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _llama(path: Path, tokenizer, *, hidden: int, layers: int, heads: int, kv_heads: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=2048, torch_dtype="float32",
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def _save(path: Path, tensors: dict, config: dict, tokenizer_from: Path) -> None:
    """A checkpoint as vLLM loads it: model.safetensors, config.json and the tokenizer's files."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, path / name)


def _weights(model: Path) -> dict:
    from safetensors.torch import load_file

    return {name: t.float() for name, t in load_file(str(model / "model.safetensors")).items()}


EAGLE3_AUX_LAYERS = (0, 2)
"""Target layers whose hidden states the EAGLE-3 head takes (`eagle_aux_hidden_state_layer_ids`). Layer 0
is the input of the first layer: the token's embedding. Without the field vLLM takes layers (2, n // 2,
n - 3) of an n-layer target: for the 4-layer target only two distinct layers, so a head declaring three
fails on the first request."""
EAGLE3_QUERY_SCALE = 2.0
"""How sharply the EAGLE-3 head attends to the positions holding its input token (see `_eagle3_head`)."""
EAGLE3_HIDDEN_WEIGHT = 1 / 16
"""How much of its input hidden state the EAGLE-3 head passes on (see `_eagle3_head`)."""


def _eagle3_head(path: Path, target: Path) -> None:
    """A one-layer EAGLE-3 head for `target` that drafts like a 1-gram prompt lookup: the token that
    followed its input token where that token occurred before.

    vLLM's `LlamaForCausalLMEagle3` (0.32) at position j takes the target's hidden states at j (through
    `fc`) and the embedding of token j+1; its attention reads [input_layernorm(embedding),
    hidden_norm(hidden state)], and its output plus the normed hidden state (`norm_before_residual`) goes
    through `norm` and `lm_head`. At later draft positions the hidden state is the head's own previous
    output. The head has no `embed_tokens`, so vLLM shares the target's. With E a token's normed
    embedding, and each of the two KV heads working on its own 64-wide slice of E's first 128 dimensions:

    - the aux hidden states are the target's layer 0 (the embedding of token j) and layer 2; `fc` copies
      the first into the hidden state, so position j's key is E(token j);
    - the query is E(input token), scaled: a position attends to where its input token stood before;
    - the value is E(token j+1), written by `o_proj` into dimensions 128-255, which `lm_head` (the same
      slices of every token's E) reads: the largest logit is the token that followed there;
    - `hidden_norm` weighs the hidden state by 1/16 (`k_proj` multiplies the key back up), so at a later
      draft position the previous draft barely reaches the logits, and its key hardly matches;
    - the MLP's output is zero, and a huge RoPE base makes the matching ignore distance.
    """
    import torch

    config = json.loads((target / "config.json").read_text())
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads, head_dim = (config["num_attention_heads"], config["num_key_value_heads"],
                                 config["head_dim"])
    eps = config["rms_norm_eps"]
    width = kv_heads * head_dim
    assert 2 * width <= hidden, "keys and values each need their own slices of the hidden size"
    group = heads // kv_heads

    embed = _weights(target)["model.embed_tokens.weight"]
    normed = embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + eps)

    fc = torch.zeros(hidden, len(EAGLE3_AUX_LAYERS) * hidden)
    fc[:width, :width] = torch.eye(width)  # aux layer 0 (the token's embedding) -> the hidden state
    q = torch.zeros(heads * head_dim, 2 * hidden)  # the input is [embedding (H), hidden state (H)]
    k = torch.zeros(width, 2 * hidden)
    v = torch.zeros(width, 2 * hidden)
    o = torch.zeros(hidden, heads * head_dim)
    eye = torch.eye(head_dim)
    for g in range(kv_heads):
        rows = dims = slice(g * head_dim, (g + 1) * head_dim)
        k[rows, hidden + g * head_dim:hidden + (g + 1) * head_dim] = eye / EAGLE3_HIDDEN_WEIGHT
        v[rows, dims] = eye
        for h in range(g * group, (g + 1) * group):
            q[h * head_dim:(h + 1) * head_dim, dims] = EAGLE3_QUERY_SCALE * eye
        first = g * group * head_dim  # the group's first query head writes the value out
        o[width + g * head_dim:width + (g + 1) * head_dim, first:first + head_dim] = eye
    lm_head = torch.zeros(vocab, hidden)
    lm_head[:, width:2 * width] = normed[:, :width]

    tensors = {
        "fc.weight": fc, "midlayer.self_attn.q_proj.weight": q, "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v, "midlayer.self_attn.o_proj.weight": o,
        "midlayer.mlp.gate_proj.weight": torch.zeros(inter, hidden),
        "midlayer.mlp.up_proj.weight": torch.zeros(inter, hidden),
        "midlayer.mlp.down_proj.weight": torch.zeros(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.full((hidden,), EAGLE3_HIDDEN_WEIGHT),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden),
        "lm_head.weight": lm_head,
    }
    _save(path, tensors, {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "float32",
        "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
        # draft_vocab_size = vocab_size: no d2t/t2d vocabulary mapping.
        "vocab_size": vocab, "draft_vocab_size": vocab,
        "num_aux_hidden_states": len(EAGLE3_AUX_LAYERS),
        "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS), "norm_before_residual": True,
        "max_position_embeddings": config["max_position_embeddings"], "rms_norm_eps": eps,
        "rope_parameters": {"rope_theta": 1e30, "rope_type": "default"}, "tie_word_embeddings": False,
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
    }, target)


MEDUSA_HEADS = 4


def _medusa_heads(path: Path, target: Path) -> None:
    """Medusa heads for `target` that draft the target's last token at every position.

    vLLM's `MedusaModel` (0.32): head i maps the target's (normed) last hidden state through a residual
    block x + SiLU(W x) and its own LM head. W is zero and every LM head is the target's, so each head's
    largest logit is the token the target just produced.
    """
    import torch

    config = json.loads((target / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    lm_head = _weights(target)["lm_head.weight"]
    tensors = {}
    for i in range(MEDUSA_HEADS):
        tensors[f"blocks.{i}.layers.0.weight"] = torch.zeros(hidden, hidden)
        tensors[f"lm_heads.{i}.weight"] = lm_head.clone()
    _save(path, tensors, {"architectures": ["MedusaModel"], "model_type": "medusa", "torch_dtype": "float32",
                          "hidden_size": hidden, "vocab_size": vocab, "num_heads": MEDUSA_HEADS,
                          "num_hidden_layers": 1}, target)


def _mtp_target(path: Path, tokenizer, *, hidden: int, layers: int, heads: int, kv_heads: int, seed: int) -> None:
    """A MiMo-shaped target: a random Qwen2 declared `MiMoForCausalLM`, with one MTP layer.

    vLLM's MiMo MTP layer (`MiMoMTPModel`, 0.32) maps [hidden_layernorm(the target's normed hidden state),
    token_layernorm(embedding of the next token)] through `input_proj` into a Qwen2 decoder layer,
    then `final_layernorm` and the target's `lm_head`. `input_proj` passes the hidden state through and
    the layer's attention and MLP outputs are zero, so it drafts the token the target just produced.
    The target itself skips the `model.mtp_layers.*` weights; `--speculative-config` `{"method": "mtp"}`
    (no `model`) loads them.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        torch_dtype="float32", bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)

    head_dim, inter = hidden // heads, hidden * 2
    generator = torch.Generator().manual_seed(seed + 1)

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    mtp = "model.mtp_layers.0."
    tensors = _weights(path)
    tensors.update({
        mtp + "token_layernorm.weight": torch.ones(hidden), mtp + "hidden_layernorm.weight": torch.ones(hidden),
        mtp + "input_proj.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1),
        mtp + "input_layernorm.weight": torch.ones(hidden), mtp + "post_attention_layernorm.weight": torch.ones(hidden),
        mtp + "self_attn.q_proj.weight": noise(heads * head_dim, hidden),
        mtp + "self_attn.q_proj.bias": torch.zeros(heads * head_dim),
        mtp + "self_attn.k_proj.weight": noise(kv_heads * head_dim, hidden),
        mtp + "self_attn.k_proj.bias": torch.zeros(kv_heads * head_dim),
        mtp + "self_attn.v_proj.weight": noise(kv_heads * head_dim, hidden),
        mtp + "self_attn.v_proj.bias": torch.zeros(kv_heads * head_dim),
        mtp + "self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim),
        mtp + "mlp.gate_proj.weight": noise(inter, hidden), mtp + "mlp.up_proj.weight": noise(inter, hidden),
        mtp + "mlp.down_proj.weight": torch.zeros(hidden, inter),
        mtp + "final_layernorm.weight": torch.ones(hidden),
    })
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    saved = json.loads((path / "config.json").read_text())
    saved.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (path / "config.json").write_text(json.dumps(saved, indent=2) + "\n")


def build_tiny_models(cache_dir: Path) -> TinyModels:
    """Build (or reuse) the tiny models under `cache_dir`; one process builds while others wait (pytest's
    workers, `pytest -n`, may ask at once)."""
    cache_dir = Path(cache_dir)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_dir.parent / f".{cache_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_tiny_models(cache_dir)


def _build_tiny_models(cache_dir: Path) -> TinyModels:
    models = TinyModels(target=cache_dir / "tiny-llama", draft=cache_dir / "tiny-llama-draft",
                        eagle3=cache_dir / "tiny-llama-eagle3",
                        medusa=cache_dir / "tiny-llama-medusa", mtp_target=cache_dir / "tiny-mimo-mtp")
    stamp = cache_dir / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("version") == RECIPE_VERSION:
        return models
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.mkdir(parents=True)
    tokenizer = _tokenizer()
    _llama(models.target, tokenizer, hidden=256, layers=4, heads=4, kv_heads=2, seed=0)
    _llama(models.draft, tokenizer, hidden=128, layers=2, heads=2, kv_heads=1, seed=1)
    _eagle3_head(models.eagle3, models.target)
    _medusa_heads(models.medusa, models.target)
    _mtp_target(models.mtp_target, tokenizer, hidden=256, layers=4, heads=4, kv_heads=2, seed=5)
    stamp.write_text(json.dumps({"version": RECIPE_VERSION}))
    return models


if __name__ == "__main__":
    import sys

    print(build_tiny_models(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/tiny-models")))
