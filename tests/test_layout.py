"""The packages depend on each other one way, as README.md's layout says: a test, so the layout cannot rot."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("utils", "config", "environment", "models", "runtime", "persistence", "training", "offline")
MAY_IMPORT = {
    "utils": set(),
    "config": {"utils"},
    "environment": {"utils", "config"},  # a market is built from a run's config (environment.loading)
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


def test_each_file_format_has_one_reader_and_one_writer():
    """The ``LATEST`` pointer and a generation's folder name are spelled in ``persistence/checkpoint.py`` alone
    (``latest_bytes`` / ``parse_latest``, ``generation_dirname`` / ``parse_dirname``), and the exported bundle's files
    in ``offline/bundle.py`` alone: a second spelling of a format is a second reader or writer that can drift."""
    owners = {
        "gen-{": "persistence/checkpoint.py",
        '"LATEST"': "persistence/checkpoint.py",
        '"actor.json"': "offline/bundle.py",
        '"actor.safetensors"': "offline/bundle.py",
    }
    spelled = []
    for package in (*PACKAGES, "main.py"):
        paths = [REPO / package] if package.endswith(".py") else sorted((REPO / package).rglob("*.py"))
        for path in paths:
            text, name = path.read_text(encoding="utf-8"), str(path.relative_to(REPO))
            spelled += [f"{name} spells {token}" for token, owner in owners.items() if token in text and name != owner]
    assert not spelled, "\n".join(spelled)
