"""What a user may put on vLLM's command line (`spec.model.extraArgs`), and what identifiers look like.

specpilot owns the engine flags its typed fields and its decisions set (the model, the speculative config,
the parallel layout, the port...). vLLM's parser (`FlexibleArgumentParser`, vllm/utils/argparse_utils.py)
accepts each of them in many spellings, and every one must be refused, or a user's flag would silently
replace what the status says the engine runs:

- `_` for `-` in the name (`--speculative_config`, `--tensor_parallel_size`);
- the value after `=` or as the next argument (`--port=80`, `--port 80`);
- dotted sub-keys of a JSON flag, with `+` for list items (`--speculative-config.num_speculative_tokens=16`);
- short aliases (`-sc`, `-tp`, `-dp`, `-pp`, ...) and `-x=value`;
- unambiguous abbreviations (argparse's allow_abbrev is on: `--speculative` means `--speculative-config`,
  `-s` means `-sc`);
- `--config FILE`, which reads more arguments, any of these included, from a YAML file;
- a bare word where no flag takes it becomes vLLM's positional `model_tag`.

Identifiers (model ids, served names, revisions) are checked as what they are: no leading `-` (it would be
read as a flag), no whitespace or control characters, a sane character set and length.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
import unicodedata

from .base import cap, echo

OWNED_FLAGS: dict[str, str] = {
    "model": "spec.model.id",
    "served-model-name": "spec.model.servedName",
    "revision": "spec.model.revision",
    "tensor-parallel-size": "spec.model.tensorParallelSize",
    "pipeline-parallel-size": "spec.model.tensorParallelSize (specpilot requests tensorParallelSize x "
                              "dataParallelSize GPUs; pipeline parallelism is not supported)",
    "data-parallel-size": "spec.model.dataParallelSize",
    "max-model-len": "spec.model.maxModelLen",
    "gpu-memory-utilization": "spec.model.gpuMemoryUtilization",
    "device-memory-utilization": "spec.model.gpuMemoryUtilization",
    "port": "spec.serving.port",
    "host": "nothing (the engine listens where its probes and the benchmark reach it)",
    "uds": "nothing (the engine serves HTTP on spec.serving.port)",
    "config": "the typed fields or separate extraArgs (a config file could set any owned flag)",
    "speculative-config": "spec.methods (specpilot decides the method and schedule)",
    "headless": "nothing (a serving pod runs the API server)",
    "nnodes": "nothing (a replica is one pod)",
    "node-rank": "nothing (a replica is one pod)",
    "hf-token": "spec.model.hfTokenSecretRef (a token on the command line is visible to anyone who can read the pod)",
}
"""Engine flags specpilot owns (long names, `-` spelling) -> the field to use instead."""

OWNED_PREFIXES: dict[str, str] = {
    "speculative-": "spec.methods (specpilot decides the method and schedule)",
    "spec-": "spec.methods (specpilot decides the method and schedule)",
    "num-speculative-tokens": "spec.methods[].numSpeculativeTokens",
    "ngram-prompt-lookup-": "spec.methods[].promptLookupMin/Max",
    "data-parallel-": "spec.model.dataParallelSize",
}
"""Families of flags specpilot owns: every flag whose name starts with one of these (older vLLM spellings
such as `--speculative-model` included)."""

OWNED_SHORT: dict[str, str] = {
    "-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size", "-dp": "data-parallel-size",
    "-dpn": "data-parallel-rank", "-dpr": "data-parallel-start-rank", "-dpl": "data-parallel-size-local",
    "-dpa": "data-parallel-address", "-dpp": "data-parallel-rpc-port", "-dpb": "data-parallel-backend",
    "-dph": "data-parallel-hybrid-lb", "-dpe": "data-parallel-external-lb",
    "-dpm": "data-parallel-multi-port-external-lb", "-sc": "speculative-config", "-n": "nnodes", "-r": "node-rank",
}
"""vLLM's short aliases of owned flags -> the long name."""

NO_VALUE_PREFIXES = ("enable-", "disable-", "no-")
"""Flags named like these take no value in vLLM (store_true / BooleanOptionalAction), so a bare word after
one is not their value: vLLM would read it as the positional model_tag."""
NO_VALUE_FLAGS = frozenset({"enforce-eager", "trust-remote-code", "skip-tokenizer-init", "async-scheduling",
                            "language-model-only", "allow-credentials", "tokens-only", "grpc"})
"""Other value-less flags a bare word is commonly placed after."""

MAX_EXTRA_ARGS = 64
MAX_ARG_LENGTH = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")

MODEL_ID_PATTERN = r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+-]*$"
"""A Hugging Face id (`org/name`), a path in the image or a volume (`/models/llama`), or a URI
(`s3://bucket/llama`): no leading '-', no whitespace or control characters."""
MODEL_ID_MAX_LENGTH = 256
SERVED_NAME_PATTERN = r"^[A-Za-z0-9_.][A-Za-z0-9_./:@+-]*$"
SERVED_NAME_MAX_LENGTH = 128
REVISION_PATTERN = r"^[A-Za-z0-9_.][A-Za-z0-9_./+-]*$"
"""A branch, tag or commit."""
REVISION_MAX_LENGTH = 128
EXTRA_ARG_PATTERN = r"^[^\x00-\x1f\x7f]*$"
"""One extraArgs item: no newline or other control character."""


def _owner_of_long(name: str) -> tuple[str, str] | None:
    """(owned flag, field to use) when the long flag `name` (no dashes, any `_`/`-`) is owned or an
    abbreviation of an owned flag."""
    base = name.split(".", 1)[0].rstrip("+").replace("_", "-")
    if base in OWNED_FLAGS:
        return base, OWNED_FLAGS[base]
    for prefix, field in OWNED_PREFIXES.items():
        if base.startswith(prefix) or base == prefix.rstrip("-"):
            return base, field
    if base:
        for flag, field in OWNED_FLAGS.items():
            if flag.startswith(base):
                return flag, field  # argparse reads an unambiguous prefix as the whole flag
        for prefix, field in OWNED_PREFIXES.items():
            if prefix.startswith(base):
                return prefix.rstrip("-"), field
    return None


def _owner_of_short(name: str) -> tuple[str, str] | None:
    for short, long in OWNED_SHORT.items():
        if name == short or short.startswith(name) or name.startswith(short):
            flag = long if long in OWNED_FLAGS else next(p for p in OWNED_PREFIXES if long.startswith(p)).rstrip("-")
            return f"{short} (--{long})", OWNED_FLAGS.get(flag) or OWNED_PREFIXES[flag + "-"]
    return None


def extra_args_problems(args: list[str], where: str = "extraArgs") -> list[str]:
    """Why each item of `args` may not be passed to vLLM, naming the item and the field to use instead
    (empty when every one is fine)."""
    problems: list[str] = []
    value_expected = False
    for i, arg in enumerate(args):
        at = f"{where}[{i}]"
        if _CONTROL.search(arg):
            problems.append(f"{at} contains a newline or another control character: pass one argument per item, "
                            f"printable characters only (got {echo(arg)})")
            value_expected = False
            continue
        if arg in ("-", "--"):
            problems.append(f"{at} is {arg!r}: vLLM would read what follows as positional arguments; remove it")
            value_expected = False
            continue
        if not arg.startswith("-") or _is_number(arg):
            if not value_expected:
                problems.append(f"{at} ({echo(arg)}) is not the value of a flag: vLLM would read it as the model "
                                f"to serve; give values as `--flag=value` or right after their flag")
            value_expected = False
            continue
        name, has_value = (arg.split("=", 1)[0], True) if "=" in arg else (arg, False)
        owner = _owner_of_long(name[2:]) if name.startswith("--") else _owner_of_short(name)
        if owner is not None:
            flag, field = owner
            shown = flag if flag.startswith("-") else f"--{flag}"
            problems.append(f"{at} ({echo(cap(arg, 60))}) sets {shown}, which specpilot owns (in any spelling: "
                            f"'_' or '-', '=value' or a separate value, dotted sub-keys, abbreviations): use "
                            f"{field} instead")
        long = name[2:].split(".", 1)[0].replace("_", "-") if name.startswith("--") else ""
        value_expected = not has_value and not (long.startswith(NO_VALUE_PREFIXES) or long in NO_VALUE_FLAGS)
    return problems


CODE_LOADING_FLAGS: dict[str, str] = {
    "tool-parser-plugin": "imports a Python file as a tool-call parser",
    "reasoning-parser-plugin": "imports a Python file as a reasoning parser",
    "middleware": "imports ASGI middleware into the engine's API server",
    "worker-cls": "imports the engine's worker class from any module",
    "worker-extension-cls": "imports a class into every engine worker",
    "scheduler-cls": "imports the engine's scheduler class from any module",
    "logits-processors": "imports logits-processor classes into the engine",
    "model-class-overrides": "registers a model class from any module",
    "logging-config": "applies a logging dictConfig, whose factories import any callable",
    "log-config-file": "applies a logging dictConfig, whose factories import any callable",
}
"""vLLM flags whose value names Python code for the engine to import (long names, `-` spelling): refused in
any spelling, whatever the value."""

CODE_LOADING_CONFIG_FLAGS: dict[str, str] = {
    "kv-transfer-config": "kv_connector_module_path imports a KV connector from any module",
    "ec-transfer-config": "ec_connector_module_path imports an encoder-cache connector from any module",
    "ec-manager-config": "encoder_cache_manager_cls imports a class from any module",
    "weight-transfer-config": "a module path imports a weight-transfer engine from any module",
    "compilation-config": "backend and inductor_passes import functions from any module",
    "distributed-executor-backend": "a class path (anything but mp, ray, uni, external_launcher) imports the "
                                    "executor from any module",
}
"""vLLM flags that import code only for some values: a module or class path in their JSON, or (for
distributed-executor-backend) a value other than a built-in backend."""

CODE_LOADING_SHORT: dict[str, str] = {"-cc": "compilation-config"}
"""vLLM's short aliases of those flags -> the long name."""

FLAGS_PREFIXING_CODE_FLAGS = frozenset({"reasoning-parser", "model"})
"""vLLM flags whose whole name is a prefix of a code-loading flag (`--reasoning-parser` of
`--reasoning-parser-plugin`): argparse takes an exact name before an abbreviation, so they are not one."""

BUILTIN_EXECUTOR_BACKENDS = frozenset({"mp", "ray", "uni", "external_launcher"})
_IMPORTING_KEY = re.compile(r"(module_path|_cls|_class|inductor_passes|pass_manager)$")


def _qualified_name(value: str) -> bool:
    """Whether `value` reads as a dotted (or `module:attr`) Python name: identifiers as Python reads them, so
    non-ASCII ones (`évil.fn`, full-width letters normalised by NFKC) count as well."""
    parts = re.split(r"[.:]", value)
    return len(parts) > 1 and all(unicodedata.normalize("NFKC", part).isidentifier() for part in parts)


def _imports_code(flag: str, keys: list[str], value: str | None) -> bool:
    """Whether `--flag[.keys...] value` makes vLLM import code (an unreadable value counts: it cannot be
    checked, and `@file` or a path is read by the engine, not by specpilot)."""
    if flag == "distributed-executor-backend":
        return value not in BUILTIN_EXECUTOR_BACKENDS
    if any(_IMPORTING_KEY.search(k.replace("-", "_")) for k in keys):
        return True
    if value is None:
        return False
    if keys:  # a dotted sub-key: its value is a scalar (a backend may be a qualified name)
        return keys[-1].replace("-", "_").endswith("backend") and _qualified_name(value)
    try:
        parsed = json.loads(value)
    except ValueError:
        return True
    return _json_imports_code(parsed)


def _json_imports_code(value: object, key: str = "") -> bool:
    if isinstance(value, dict):
        return any(_IMPORTING_KEY.search(str(k)) is not None or _json_imports_code(v, str(k))
                   for k, v in value.items())
    if isinstance(value, list):
        return any(_json_imports_code(v, key) for v in value)
    return isinstance(value, str) and key.endswith("backend") and _qualified_name(value)


def _code_loading_flag(name: str) -> tuple[str, bool] | None:
    """(vLLM flag, whether only some values load code) for an argument's flag part (`--x`, `--x.key`, `-cc`),
    abbreviations included; None for a flag that loads no code."""
    if not name.startswith("--"):
        flag = name.split(".", 1)[0]
        short = next((s for s in CODE_LOADING_SHORT if flag == s or s.startswith(flag) or flag.startswith(s)), None)
        return (CODE_LOADING_SHORT[short], True) if short else None
    base = name[2:].split(".", 1)[0].rstrip("+").replace("_", "-")
    for table, conditional in ((CODE_LOADING_FLAGS, False), (CODE_LOADING_CONFIG_FLAGS, True)):
        if base in table:
            return base, conditional
    if base and base not in FLAGS_PREFIXING_CODE_FLAGS:
        for table, conditional in ((CODE_LOADING_FLAGS, False), (CODE_LOADING_CONFIG_FLAGS, True)):
            for flag in table:
                if flag.startswith(base):
                    return flag, conditional  # argparse reads an unambiguous prefix as the whole flag
    return None


def flag_items(args: list[str]) -> Iterator[tuple[int, str, str, str | None]]:
    """(index, argument, its flag part before any `=`, its value) for each flag of vLLM arguments: the value after
    `=`, else the next argument unless that is a flag itself (a negative number is a value). Numbers and
    arguments with control characters are not flags."""
    for i, arg in enumerate(args):
        if not arg.startswith("-") or _is_number(arg) or _CONTROL.search(arg):
            continue
        name, value = arg.split("=", 1) if "=" in arg else (arg, None)
        if value is None and i + 1 < len(args) and not (args[i + 1].startswith("-")
                                                        and not _is_number(args[i + 1])):
            value = args[i + 1]
        yield i, arg, name, value


def code_loading_problems(args: list[str], where: str = "extraArgs") -> list[str]:
    """Why items of `args` would make vLLM import Python code named on its command line (a plugin, middleware,
    worker or scheduler class, a connector's module path...), in every spelling `extra_args_problems` knows:
    `_` or `-`, `=value` or a separate value, dotted sub-keys, abbreviations, short aliases."""
    problems: list[str] = []
    for i, arg, name, value in flag_items(args):
        found = _code_loading_flag(name)
        if found is None:
            continue
        flag, conditional = found
        keys = [k.rstrip("+") for k in name.split(".")[1:]]
        if conditional and not _imports_code(flag, keys, value):
            continue
        why = CODE_LOADING_CONFIG_FLAGS[flag] if conditional else CODE_LOADING_FLAGS[flag]
        problems.append(f"{where}[{i}] ({echo(cap(arg, 60))}) sets --{flag}, which makes the engine import code "
                        f"({why}): remove it; the engine runs the code of its image (spec.model.image) and model only")
    return problems


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def owned_flags_cel_rule() -> dict[str, str]:
    """A CEL rule for one extraArgs item refusing the plain spellings of owned flags (long names with `-` or
    `_`, `=value`, dotted sub-keys, short aliases), so the API server refuses them before the operator sees
    them. Abbreviations and positional words depend on the neighbouring items: the operator checks those."""
    def flexible(flag: str) -> str:
        return flag.replace("-", "[-_]")

    longs = "|".join(flexible(f) for f in sorted(OWNED_FLAGS))
    prefixes = "|".join(flexible(p) + "[^=.]*" if p.endswith("-") else flexible(p) for p in sorted(OWNED_PREFIXES))
    shorts = "|".join(s[1:] for s in sorted(OWNED_SHORT))
    pattern = f"^(--({longs}|{prefixes})([=.+].*)?|-({shorts})(=.*)?)$"
    return {"rule": f"!self.matches('{pattern}')",
            "message": "sets an engine flag specpilot owns (the model, speculative config, parallel layout, port, "
                       "host, config file...): use the typed field instead"}
