"""One markdown row of a run's timings for ``benchmarks/gpu_smoke.sh``: ``python benchmarks/smoke_figures.py LABEL
RUN_DIR [EXTRA ...]`` prints ``| LABEL | figures | EXTRA ... |`` from ``RUN_DIR/metrics.jsonl``.

The figures are medians over the generations that show a steady run (``steady_rows``): after the first (start-up,
cold caches), and in a graphed run only those after its first capture that captured no CUDA graph. A graphed step
warms up eagerly for two calls and captures in the third, so without this rule a graphed run's medians of a few
generations mix eager generations and capturing ones with its replays.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from run.records import DURATION_KEYS


def steady_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The rows the medians are taken over, and a note for the label ("" when the rule held). Where every generation
    after the first capture captured again (the update is captured anew while the replay buffer fills), those
    generations, noted."""
    captured = [i for i, row in enumerate(rows) if row.get("graph_captures")]
    after = captured[0] + 1 if captured else 1
    steady = [row for row in rows[after:] if not row.get("graph_captures")]
    if steady:
        return steady, ""
    if captured and rows[after:]:
        return rows[after:], " (a graph captured in every generation: the buffer was filling)"
    return rows[-1:], " (no generation after the first: raise GPU_SMOKE_GENERATIONS)"


def row(label: str, run_dir: Path, extra: list[str]) -> str:
    rows, note = steady_rows([json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()])

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows if r.get(key) is not None)

    cells = [f"{median(key):.3f}" for key in DURATION_KEYS]
    cells.append(f"{median('env_steps_per_s'):,.0f}")
    cells.append(f"{max(r['cuda_reserved_bytes'] for r in rows) / 2**30:.2f} GiB")
    return "| " + " | ".join([label + note, *cells, *extra]) + " |"


if __name__ == "__main__":
    print(row(sys.argv[1], Path(sys.argv[2]), sys.argv[3:]))
