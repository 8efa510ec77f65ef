"""The packages depend on each other one way, as README.md's layout says: a test, so the layout cannot rot."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("utils", "config", "environment", "models", "runtime", "persistence", "training", "run", "offline")
MAY_IMPORT = {
    "utils": set(),
    "config": {"utils"},
    "environment": {"utils", "config"},  # a market is built from a run's config (environment.loading)
    "models": {"environment", "utils", "config"},
    "runtime": {"models", "utils", "config"},
    "persistence": {"environment", "models", "utils", "config"},
    "training": {"runtime", "models", "environment", "utils", "config"},  # the algorithm: no runs, no files
    "run": {"training", "runtime", "persistence", "models", "environment", "utils", "config"},
    "offline": {"run", "training", "runtime", "persistence", "models", "environment", "utils", "config"},
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
    for package in ("training", "run", "runtime", "persistence", "offline", "models", "environment", "utils"):
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


def imported_modules(path: Path, package: str) -> set[str]:
    """The modules of ``package`` a file imports (``from package import module`` names its module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(f"{package}.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == package:
                found |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(f"{package}."):
                found.add(node.module)
    return found


def test_offline_borrows_at_most_two_modules_of_the_algorithm():
    """offline/ scores what a run made: of training/ it reads the training days (``fitness``) and the gate's
    bootstrap (``selection``), never the loop's insides; what drives a run is run/'s."""
    borrowed = set()
    for path in sorted((REPO / "offline").rglob("*.py")):
        borrowed |= imported_modules(path, "training")
    assert len(borrowed) <= 2, sorted(borrowed)


def test_the_module_counter_sees_each_form_of_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import training.loop\nfrom training import rollout\nfrom training.selection import x\n")
    assert imported_modules(module, "training") == {"training.loop", "training.rollout", "training.selection"}


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def product_files() -> list[Path]:
    return [REPO / "main.py", *(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))]


def long_functions(path: Path, *, root: Path = REPO) -> list[str]:
    """Functions over ``MAX_FUNCTION_LINES`` lines whose docstring does not say why they read whole."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        reason = "reads whole" in " ".join((ast.get_docstring(node) or "").split())
        if node.end_lineno - node.lineno >= MAX_FUNCTION_LINES and not reason:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_no_module_or_function_outgrows_one_reading():
    """A module over 600 lines or a function over 80 holds two concerns more often than not: split it, or say in its
    docstring why it reads whole."""
    long_modules = [
        f"{path.relative_to(REPO)} ({lines} lines)"
        for path in product_files()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long_modules, long_modules
    assert not [name for path in product_files() for name in long_functions(path)]


def test_the_length_check_sees_a_long_function_and_its_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    module = tmp_path / "m.py"
    module.write_text(f"def long():\n{body}\n\ndef kept():\n    '''It reads whole: one table.'''\n{body}")
    assert [entry.split()[-1] for entry in long_functions(module, root=tmp_path)] == ["long"]
