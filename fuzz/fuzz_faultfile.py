"""Fuzz the fault-file loader (proxy/core/faultfile.py): any text, and any JSON for the control API.

Invariants: :func:`invariants.check_fault_text` and :func:`invariants.check_rules_data` (rules
or ``FaultFileError``, nothing else; what loads can be used and round-trips).
"""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["proxy"]):
    import invariants

from target import run


def test_one_input(data: bytes) -> None:
    """The bytes as a file's text, and as the JSON body of ``PUT /api/rules``."""
    invariants.check_fault_text(data.decode("utf-8", "replace"))  # not UTF-8: refused unread
    invariants.check_rules_data(invariants.json_structure(data))


if __name__ == "__main__":
    run(test_one_input, "faultfiles")
