"""The packages depend on each other one way, as README.md's layout says: a test, so the layout cannot rot."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("utils", "config", "environment", "models", "runtime", "persistence", "training", "offline")
MAY_IMPORT = {
    "utils": set(),
    "config": {"utils"},
    "environment": {"utils"},
    "models": {"environment", "utils", "config"},
    "runtime": {"models", "utils", "config"},
    "persistence": {"environment", "models", "utils", "config"},
    "training": {"runtime", "persistence", "models", "environment", "utils", "config"},
    "offline": {"training", "runtime", "persistence", "models", "environment", "utils", "config"},
}
"""What each package may import besides itself (``config`` imports ``utils.errors`` only)."""


def imported_packages(path: Path) -> set[str]:
    """The top-level project modules a file imports, wherever the import statement is (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & {*PACKAGES, "config", "main"}


def test_every_package_imports_only_what_the_layout_allows():
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((REPO / package).rglob("*.py")):  # sub-packages too
            for target in imported_packages(path) - allowed - {package}:
                wrong.append(f"{path.relative_to(REPO)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_import_the_layout_forbids(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from offline.holdout import score\n    import training.loop\n")
    assert imported_packages(module) == {"offline", "training"}


def test_tests_mirror_the_packages():
    for package in ("training", "runtime", "persistence", "offline", "models", "environment", "utils"):
        assert (REPO / "tests" / package).is_dir(), f"tests/{package} is missing"
