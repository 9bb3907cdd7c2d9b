"""Model shapes: the sizes the twin needs (weights streamed per step, KV bytes per token, FLOPs).

Built-in targets (Llama-3.1-8B, Llama-3.3-70B, Qwen3-8B), drafter models (Llama-3.2-1B, Qwen3-0.6B) and
speculative heads (EAGLE, EAGLE-3, MTP, Medusa) built from their target's width. `from_hf_config` derives
a shape from any dense decoder's HF `config.json`; `resolve_model` maps an HF model id to a built-in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..api.methods import ALL_HEADS_AT_ONCE_FAMILIES, HOST_DRAFTED_FAMILIES, METHOD_FAMILIES, SpeculativeMethod

__all__ = [
    "BUILTIN_MODELS",
    "ModelShape",
    "UnknownModelError",
    "default_drafter",
    "eagle_head",
    "from_hf_config",
    "medusa_heads",
    "mtp_head",
    "resolve_model",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelShape:
    """The dimensions of a decoder (or of a speculative head) that set its memory and compute cost."""

    name: str
    num_params: int
    """Parameters one forward pass uses, including an input embedding table and any borrowed lm head."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    """Bytes per weight and per KV element (2 for bf16)."""
    input_embedding_params: int = 0
    """Parameters of an input embedding table a step only gathers rows from (untied decoders)."""
    shared_params: int = 0
    """Parameters borrowed from the target (an EAGLE/MTP head's lm head): read every pass, stored once."""

    def __post_init__(self) -> None:
        if self.num_params <= 0:
            raise ValueError(f"ModelShape {self.name!r}: num_params must be > 0 (got {self.num_params})")
        for field in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "input_embedding_params",
                      "shared_params"):
            if getattr(self, field) < 0:
                raise ValueError(f"ModelShape {self.name!r}: {field} must be >= 0 (got {getattr(self, field)})")
        if self.dtype_bytes <= 0:
            raise ValueError(f"ModelShape {self.name!r}: dtype_bytes must be > 0 (got {self.dtype_bytes})")
        if self.input_embedding_params + self.shared_params > self.num_params:
            raise ValueError(
                f"ModelShape {self.name!r}: input_embedding_params + shared_params exceed num_params"
            )

    @property
    def weight_bytes(self) -> int:
        """All weights, bytes."""
        return self.num_params * self.dtype_bytes

    @property
    def streamed_params(self) -> int:
        """Parameters read from memory (and multiplied) for every token of a forward pass."""
        return self.num_params - self.input_embedding_params

    @property
    def streamed_weight_bytes(self) -> int:
        """Weight bytes a decode step reads: all weights except the rows-only embedding lookup."""
        return self.streamed_params * self.dtype_bytes

    @property
    def resident_weight_bytes(self) -> int:
        """Device memory the weights add when loaded beside a target (borrowed weights are not copied)."""
        return (self.num_params - self.shared_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: keys and values of every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int) -> int:
        """KV bytes per token on one GPU of a TP group (KV heads are replicated when fewer than GPUs)."""
        kv_heads_per_gpu = -(-self.num_kv_heads // tensor_parallel_size) if self.num_kv_heads else 0
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    @property
    def attention_width(self) -> int:
        """Query heads x head dim: sets attention FLOPs per (query token, context token) pair."""
        return self.num_attention_heads * self.head_dim


class UnknownModelError(KeyError):
    """A model id that matches no built-in shape."""

    def __init__(self, model_id: str, known: tuple[str, ...]) -> None:
        self.model_id = model_id
        self.known = known
        super().__init__(model_id)

    def __str__(self) -> str:
        return (
            f"unknown model {self.model_id!r}; built-in shapes: {', '.join(self.known)}. For another model, "
            f"build its shape with specpilot.perf.models.from_hf_config(config_json_dict, name)"
        )


def _decoder_layer_params(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                          qkv_input: int | None = None, qkv_bias: bool = False, qk_norm: bool = False) -> int:
    """One pre-norm decoder layer with grouped-query attention and a gated (SwiGLU) MLP."""
    qkv_in = hidden if qkv_input is None else qkv_input
    q_out = heads * head_dim
    kv_out = kv_heads * head_dim
    attention = qkv_in * (q_out + 2 * kv_out) + q_out * hidden
    if qkv_bias:
        attention += q_out + 2 * kv_out
    if qk_norm:
        attention += 2 * head_dim
    mlp = 3 * hidden * intermediate
    return attention + mlp + 2 * hidden


def _decoder(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
             intermediate: int, vocab: int, tied: bool, qkv_bias: bool = False, qk_norm: bool = False,
             dtype_bytes: int = 2) -> ModelShape:
    embedding = vocab * hidden
    params = (
        embedding
        + layers * _decoder_layer_params(hidden, heads, kv_heads, head_dim, intermediate,
                                         qkv_bias=qkv_bias, qk_norm=qk_norm)
        + hidden
        + (0 if tied else vocab * hidden)
    )
    return ModelShape(
        name=name, num_params=params, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab,
        dtype_bytes=dtype_bytes,
        # a tied table is also the lm head, so every step streams it whole
        input_embedding_params=0 if tied else embedding,
    )


def eagle_head(target: ModelShape, variant: str = "eagle3", draft_vocab_size: int = 32000,
               name: str | None = None) -> ModelShape:
    """An EAGLE (variant "eagle") or EAGLE-3 ("eagle3") draft head for `target`.

    EAGLE (arXiv 2401.15077): one decoder layer of the target's width fed by fc(2h -> h) over [token
    embedding, target hidden state]; it borrows the target's embedding and lm head. EAGLE-3 (arXiv
    2503.01840): fc(3h -> h) fuses three target layers' hidden states, the layer's QKV reads the 2h
    concatenation, and it has its own lm head over a reduced draft vocabulary (32k for Llama 3).
    """
    hidden = target.hidden_size
    if variant == "eagle":
        fc = 2 * hidden * hidden
        layer = _decoder_layer_params(hidden, target.num_attention_heads, target.num_kv_heads, target.head_dim,
                                      target.intermediate_size)
        lm_head = target.vocab_size * hidden
        params = fc + layer + hidden + lm_head
        shared = lm_head
        vocab = target.vocab_size
        default_name = f"{target.name}-EAGLE"
    elif variant == "eagle3":
        fc = 3 * hidden * hidden
        layer = _decoder_layer_params(hidden, target.num_attention_heads, target.num_kv_heads, target.head_dim,
                                      target.intermediate_size, qkv_input=2 * hidden)
        lm_head = draft_vocab_size * hidden
        params = fc + layer + hidden + lm_head
        shared = 0
        vocab = draft_vocab_size
        default_name = f"{target.name}-EAGLE3"
    else:
        raise ValueError(f"variant must be 'eagle' or 'eagle3' (got {variant!r})")
    return ModelShape(
        name=name or default_name, num_params=params, num_layers=1, hidden_size=hidden,
        num_attention_heads=target.num_attention_heads, num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim, intermediate_size=target.intermediate_size, vocab_size=vocab,
        dtype_bytes=target.dtype_bytes, shared_params=shared,
    )


def mtp_head(target: ModelShape, name: str | None = None) -> ModelShape:
    """A multi-token-prediction module (DeepSeek-V3, arXiv 2412.19437): one decoder layer, fc(2h -> h),
    and the target's embedding and lm head, reused recursively for drafts beyond the first."""
    hidden = target.hidden_size
    layer = _decoder_layer_params(hidden, target.num_attention_heads, target.num_kv_heads, target.head_dim,
                                  target.intermediate_size)
    lm_head = target.vocab_size * hidden
    return ModelShape(
        name=name or f"{target.name}-MTP", num_params=2 * hidden * hidden + layer + 3 * hidden + lm_head,
        num_layers=1, hidden_size=hidden, num_attention_heads=target.num_attention_heads,
        num_kv_heads=target.num_kv_heads, head_dim=target.head_dim, intermediate_size=target.intermediate_size,
        vocab_size=target.vocab_size, dtype_bytes=target.dtype_bytes, shared_params=lm_head,
    )


def medusa_heads(target: ModelShape, num_heads: int = 4, name: str | None = None) -> ModelShape:
    """Medusa-1 heads (arXiv 2401.10774): per head one residual block (h x h) and its own lm head.

    The heads read only the target's last hidden state (no attention, so no KV cache); all heads run once
    per step, so `num_layers` is 0 and `num_attention_heads` holds the number of Medusa heads.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1 (got {num_heads})")
    hidden = target.hidden_size
    per_head = hidden * hidden + hidden + hidden * target.vocab_size
    return ModelShape(
        name=name or f"{target.name}-Medusa{num_heads}", num_params=num_heads * per_head, num_layers=0,
        hidden_size=hidden, num_attention_heads=num_heads, num_kv_heads=0, head_dim=0, intermediate_size=0,
        vocab_size=target.vocab_size, dtype_bytes=target.dtype_bytes,
    )


# Configs: meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-3.3-70B-Instruct, meta-llama/Llama-3.2-1B,
# Qwen/Qwen3-8B, Qwen/Qwen3-0.6B config.json on the Hugging Face Hub.
_LLAMA_3_1_8B = _decoder("Llama-3.1-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                         intermediate=14336, vocab=128256, tied=False)
_LLAMA_3_3_70B = _decoder("Llama-3.3-70B", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                          intermediate=28672, vocab=128256, tied=False)
_QWEN3_8B = _decoder("Qwen3-8B", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                     intermediate=12288, vocab=151936, tied=False, qk_norm=True)
_LLAMA_3_2_1B = _decoder("Llama-3.2-1B", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                         intermediate=8192, vocab=128256, tied=True)
_QWEN3_0_6B = _decoder("Qwen3-0.6B", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128,
                       intermediate=3072, vocab=151936, tied=True, qk_norm=True)

BUILTIN_MODELS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        _LLAMA_3_1_8B,
        _LLAMA_3_3_70B,
        _QWEN3_8B,
        _LLAMA_3_2_1B,
        _QWEN3_0_6B,
        # Published draft heads (yuhuili/* on the Hub, the checkpoints the EAGLE papers evaluate).
        eagle_head(_LLAMA_3_1_8B, "eagle", name="EAGLE-LLaMA3.1-Instruct-8B"),
        eagle_head(_LLAMA_3_1_8B, "eagle3", name="EAGLE3-LLaMA3.1-Instruct-8B"),
        eagle_head(_LLAMA_3_3_70B, "eagle3", name="EAGLE3-LLaMA3.3-Instruct-70B"),
        eagle_head(_QWEN3_8B, "eagle3"),
        mtp_head(_LLAMA_3_1_8B),
        mtp_head(_QWEN3_8B),
        medusa_heads(_LLAMA_3_1_8B),
    )
}

# Other spellings of the built-ins seen in model ids.
_ALIASES = {
    "meta-llama-3.1-8b": "Llama-3.1-8B",
    "meta-llama-3.3-70b": "Llama-3.3-70B",
    "qwen3_8b_eagle3": "Qwen3-8B-EAGLE3",  # Tengyunw/qwen3_8b_eagle3
}


def _model_key(model_id: str) -> str:
    """Case-insensitive key of a model id: no org prefix, no "-Instruct"."""
    name = model_id.rsplit("/", 1)[-1].casefold()
    return name.replace("-instruct", "")


_BY_KEY = {_model_key(name): shape for name, shape in BUILTIN_MODELS.items()}


def resolve_model(model_id: str) -> ModelShape:
    """The built-in shape for an HF model id such as "meta-llama/Llama-3.1-8B-Instruct" or "Qwen/Qwen3-8B"."""
    key = _model_key(model_id)
    shape = _BY_KEY.get(key) or BUILTIN_MODELS.get(_ALIASES.get(key, ""))
    if shape is None:
        raise UnknownModelError(model_id, tuple(BUILTIN_MODELS))
    return shape


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


def from_hf_config(config: Mapping[str, object], name: str) -> ModelShape:
    """A shape from a dense decoder's HF `config.json` (Llama, Qwen2/3, Mistral style), counting parameters.

    Reads hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: attention
    heads), head_dim (default: hidden / heads), intermediate_size, vocab_size, tie_word_embeddings,
    attention_bias / model_type qwen2 (QKV bias), model_type qwen3 (q/k norms) and torch_dtype.
    """
    if isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]  # multimodal wrappers keep the language model's config here
    if any(key in config for key in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise ValueError(
            f"{name}: mixture-of-experts configs are not modelled (active parameters differ from total); "
            f"build a ModelShape with num_params set to the active parameters instead"
        )
    missing = [key for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size") if key not in config]
    if missing:
        raise ValueError(f"{name}: config.json lacks {', '.join(missing)} needed to size the model")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    model_type = str(config.get("model_type", ""))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{name}: torch_dtype {dtype!r} is not one of {', '.join(_DTYPE_BYTES)}")
    return _decoder(
        name,
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", False)) or model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        dtype_bytes=_DTYPE_BYTES[dtype],
    )


_DRAFT_MODEL_BY_VOCAB = {_LLAMA_3_2_1B.vocab_size: _LLAMA_3_2_1B, _QWEN3_0_6B.vocab_size: _QWEN3_0_6B}


def default_drafter(method: str, target: ModelShape, num_medusa_heads: int = 5) -> ModelShape | None:
    """The drafter the twin assumes for `method` when none is given (None for ngram and suffix).

    draft_model: the smallest built-in sharing the target's vocabulary (Llama-3.2-1B, Qwen3-0.6B);
    eagle / eagle3 / mtp: a head of the target's width; medusa: `num_medusa_heads` heads (the paper's 5).
    """
    if method in HOST_DRAFTED_FAMILIES:
        return None
    if method == SpeculativeMethod.DRAFT_MODEL:
        drafter = _DRAFT_MODEL_BY_VOCAB.get(target.vocab_size)
        if drafter is None or drafter.name == target.name:
            raise ValueError(
                f"no built-in draft model shares {target.name}'s vocabulary ({target.vocab_size} tokens); "
                f"pass drafter=from_hf_config(<draft config.json>, name)"
            )
        return drafter
    if method in (SpeculativeMethod.EAGLE, SpeculativeMethod.EAGLE3):
        return eagle_head(target, method)
    if method == SpeculativeMethod.MTP:
        return mtp_head(target)
    if method in ALL_HEADS_AT_ONCE_FAMILIES:
        return medusa_heads(target, num_heads=num_medusa_heads)
    raise ValueError(f"unknown speculative method {method!r}; use one of {', '.join(METHOD_FAMILIES)}")
