"""Helpers of the reusable action's run.sh (action.yml): what it needs to know from batchcheck itself.

    python3 action/inputs.py config [CONFIG]   # the config ci uses, then its counterexample folder (2 lines)
    python3 action/inputs.py policies < FILES  # of the file names on stdin, the ones that are policy files
Errors print nothing: ci then runs and reports them itself (exit 2 with the file and the field).
"""

from __future__ import annotations

import sys
from pathlib import Path


def config(given: str) -> None:
    from checker.ci.config import load_config
    from checker.ci.run import find_config

    path = Path(given) if given else find_config()
    cfg, _ = load_config(path)
    print(path)
    print(path.resolve().parent / cfg.output.counterexamples)


def policies(names: list[str]) -> None:
    from checker.api import guess_kind
    from checker.errors import BatchcheckError
    from checker.loading import load_document

    for name in names:
        if not name.endswith((".yaml", ".yml")) or not Path(name).is_file():
            continue
        try:
            if guess_kind(name, load_document(name)[0]) == "policy":
                print(name)
        except BatchcheckError:  # not a document batchcheck reads as a policy
            pass


if __name__ == "__main__":
    try:
        if sys.argv[1] == "config":
            config(sys.argv[2] if len(sys.argv) > 2 else "")
        else:
            policies(sys.stdin.read().splitlines())
    except Exception:  # noqa: BLE001 - see the docstring: ci reports bad input itself
        sys.exit(1)
