"""The build that runs: pure Python, or the optional compiled core (pyproject.toml's mypyc hook).

The README's test command runs the pure build; ``.ci/run`` then builds the compiled core in
place and runs the tests of what it compiles again, with ``ACP_PROXY_EXPECT_COMPILED=1``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from proxy import compiled_modules, core_build

ROOT = Path(__file__).parent.parent


def hook_modules() -> list[str]:
    """The modules pyproject.toml's mypyc hook compiles, by dotted name."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        hook = tomllib.load(file)["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["mypyc"]
    assert hook["enable-by-default"] is False  # the compiled core is optional
    return sorted(path.strip("/").removesuffix(".py").replace("/", ".") for path in hook["include"])


def test_the_build_under_test_is_the_one_expected() -> None:
    """Pure Python unless told the compiled core is expected: then exactly the hook's modules
    run compiled (a module the hook names that stays pure, or one left over from an earlier
    build, fails here rather than testing another build than the one meant)."""
    expected = hook_modules() if os.environ.get("ACP_PROXY_EXPECT_COMPILED") == "1" else []
    assert compiled_modules() == expected, "find proxy -name '*.so' -delete, to test the pure build"
    assert core_build() == (
        f"core compiled with mypyc ({len(expected)} modules)" if expected else "pure Python"
    )
