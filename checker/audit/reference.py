"""The field tables of the audit records, as they appear in docs/audit.md ("The records").

Generated from the models so that they cannot drift; tests/unit/test_audit.py checks that docs/audit.md
contains the current text. Print it with ``python -m checker.audit.reference``.
"""

from __future__ import annotations

from checker.audit.records import AuditContract, AuditWorkload
from checker.docgen import render_model


def render() -> str:
    out: list[str] = []
    seen: set[type] = set()
    for model in (AuditContract, AuditWorkload):
        render_model(model, seen, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
