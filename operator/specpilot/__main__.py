"""`python -m specpilot [run flags]` starts the operator, like `specpilot run`."""

import sys

from .cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(main(argv if argv and argv[0] in ("run", "-h", "--help") else ["run", *argv]))
