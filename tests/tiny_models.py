"""Tiny local models for running the real vLLM engine on a CPU: a target Llama and a smaller draft.

Random weights, no download: a ByteLevel BPE tokenizer trained on Python's own standard-library
sources, a 4-layer Llama (head_dim 64, which the CPU attention backend accepts) and a 2-layer draft
sharing that tokenizer (so it can serve `draft_model`). Random weights loop on a few tokens, so n-gram
acceptance comes out near 100%: right for testing mechanics, meaningless as a measurement.

`build_tiny_models(cache_dir)` builds both once (about 10 s) and reuses them while the recipe is unchanged.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

RECIPE_VERSION = "1"
"""Bump when the recipe changes so cached builds are rebuilt."""

VOCAB_SIZE = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]


@dataclass(frozen=True)
class TinyModels:
    """Where the built models live."""

    target: Path
    """The target Llama (weights, config and tokenizer)."""
    draft: Path
    """The draft Llama for `draft_model` (same tokenizer)."""


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


def build_tiny_models(cache_dir: Path) -> TinyModels:
    """Build (or reuse) the tiny target and draft models under `cache_dir`."""
    cache_dir = Path(cache_dir)
    models = TinyModels(target=cache_dir / "tiny-llama", draft=cache_dir / "tiny-llama-draft")
    stamp = cache_dir / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("version") == RECIPE_VERSION:
        return models
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.mkdir(parents=True)
    tokenizer = _tokenizer()
    _llama(models.target, tokenizer, hidden=256, layers=4, heads=4, kv_heads=2, seed=0)
    _llama(models.draft, tokenizer, hidden=128, layers=2, heads=2, kv_heads=1, seed=1)
    stamp.write_text(json.dumps({"version": RECIPE_VERSION}))
    return models


if __name__ == "__main__":
    import sys

    print(build_tiny_models(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/tiny-models")))
