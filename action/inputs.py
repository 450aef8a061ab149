"""A helper of the reusable action's run.sh (action.yml): the counterexample folder of the config ci uses.

    python3 action/inputs.py [CONFIG]   # prints the folder (the config's [output] counterexamples)
Errors print nothing: ci then runs and reports them itself (exit 2 with the file and the field).
"""

from __future__ import annotations

import sys
from pathlib import Path


def counterexample_folder(given: str) -> Path:
    from checker.ci.config import load_config
    from checker.ci.run import find_config

    path = Path(given) if given else find_config()
    cfg, _ = load_config(path)
    return path.resolve().parent / cfg.output.counterexamples


if __name__ == "__main__":
    try:
        print(counterexample_folder(sys.argv[1] if len(sys.argv) > 1 else ""))
    except Exception:  # noqa: BLE001 - see the docstring: ci reports bad input itself
        sys.exit(1)
