"""The simulated engine behind a Hugging Face Hub, for the operator scenarios: `python -m tests.operator.hub_engine`
takes vLLM's server arguments, first loads the config of the model and of the speculative config's drafter as vLLM
does before anything else (transformers' AutoConfig, from the Hub at HF_ENDPOINT unless the id is a local folder),
then runs the sandbox's simulated engine with the same arguments. A Hub that refuses a download stops the start
with the libraries' own error and traceback, as it stops vLLM's."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys


def _load_configs(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model")
    parser.add_argument("--revision")
    parser.add_argument("--speculative-config")
    args, _ = parser.parse_known_args(argv)
    from transformers import AutoConfig

    AutoConfig.from_pretrained(args.model, revision=args.revision)
    drafter = json.loads(args.speculative_config).get("model") if args.speculative_config else None
    if drafter and not os.path.isdir(drafter):
        AutoConfig.from_pretrained(drafter)


if __name__ == "__main__":
    _load_configs(sys.argv[1:])
    sys.argv[0] = "specpilot_sandbox.engine"
    runpy.run_module("specpilot_sandbox.engine", run_name="__main__", alter_sys=True)
