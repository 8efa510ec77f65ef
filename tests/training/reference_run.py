"""A small CPU run and its evaluation, as figures to compare across versions: ``python tests/training/reference_run.py
[--set KEY=VALUE ...]`` prints the population's parameter hash, each generation's fitness and validation figures and
the evaluation's metrics as JSON. One torch thread, so that the figures depend on the code and the machine alone."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import main

ROW_KEYS = ("actor_loss", "best_fitness", "mean_fitness", "worst_fitness", "validation_best", "validation_mean")


def reference(extra: list[str]) -> dict:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--preset", "smoke", "--generations", "3", "--checkpoint-uri", tmp, "--run-name", "g", "--no-progress"]
        args += ["--device", "cpu", "--set", "learner.learning_starts=64", *extra]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main.main(args) == 0
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main.main(["inspect", f"{tmp}/g", "--json"]) == 0
        params = json.loads(printed.getvalue())["params_sha256"]
        rows = [json.loads(line) for line in Path(f"{tmp}/g/metrics.jsonl").read_text().splitlines()]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            assert main.main(["evaluate", f"{tmp}/g", "--json", "--out", f"{tmp}/evaluation"]) == 0
        evaluation = json.loads(printed.getvalue())
    return {
        "params_sha256": params,
        "rows": [{key: row.get(key) for key in ROW_KEYS} for row in rows],
        "metrics": {name: part["metrics"] for name, part in evaluation["ranges"].items()},
    }


if __name__ == "__main__":
    print(json.dumps(reference(sys.argv[1:]), indent=1, sort_keys=True))
