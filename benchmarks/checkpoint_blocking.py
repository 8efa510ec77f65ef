"""How long the training loop blocks for a checkpoint, before and after staging, side by side in one run.

    python benchmarks/checkpoint_blocking.py              # the paper preset's shape on the CPU; about 2 minutes
    python benchmarks/checkpoint_blocking.py --json
    python benchmarks/checkpoint_blocking.py --set learner.buffer_size=100000 --checkpoints 3

One trainer at the ``paper`` preset (32 agents, lookback 252, a million-transition buffer) on the bundled data and the
CPU. Collecting a million transitions at this shape would take hours on a CPU, so the buffer is filled to capacity
with random transitions of the right dtypes: the bytes written, hashed and copied are the same. Then, in the same
process and run folder:

* synchronous: the path before staging, as it was: ``write_generation`` inline on the live tensors, the buffer in one
  file, retention and the metrics row, everything the loop used to block for;
* staged: ``Checkpointing.save``, the loop's own path: the wait for the write before (if any), the copy into the
  staging buffers, the start of the writer thread. Between two staged checkpoints the benchmark sleeps
  ``--train-s`` seconds in place of a generation's training (a paper generation on this CPU takes many minutes, on a
  GPU the write then overlaps it); with ``--train-s 0`` each checkpoint comes right after the one before and waits
  for its whole write.

Before every checkpoint, both ways, a generation's worth of change is made: every population tensor moves, and
the transitions a generation stores (P x exploring episodes x episode_days: 129,024 at the paper shape) are written
into the buffer where the next ones would go. The staged path holds the buffer in segments
(``persistence.generation_contents.SEGMENTS``), and a segment no transition reached since the generation that retention
deletes as this one is committed (3 back with ``checkpoint.keep_last`` 3) is a hard link to that generation's file
(``persistence.checkpoint``): the report gives the bytes each checkpoint actually writes. The first three staged
checkpoints have no segment files to link to (the generation leaving is a synchronous one), the later ones show the
steady state.

The first staged checkpoint allocates the staging buffers (their pages are touched for the first time): it is
part of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from config import Config, override, parse_assignments, preset
from environment.loading import load_market
from persistence import checkpoint, committing, jsonl
from persistence.generation_contents import buffer_groups
from run.trainer import Trainer
from utils.telemetry import format_bytes


def paper_config(settings: dict[str, str]) -> Config:
    """The paper preset at the 252-day observation it had until issue 21: the stress shape of BENCHMARKS.md."""
    stress = {"env.lookback": 252, "runtime.device": "cpu", "runtime.progress": False}
    return override(preset("paper"), {**stress, **settings})


@torch.no_grad()
def fill_ring(trainer: Trainer, generator: torch.Generator) -> None:
    """Random transitions in every row of the buffer, of the dtypes and ranges it holds, and the buffer marked full."""
    buffer = trainer.buffer
    days = trainer.market.splits.train
    for key, tensor in buffer.storage.items():
        if key == "days":
            tensor.copy_(torch.randint(days.start, days.stop - 1, tensor.shape, generator=generator))
        elif tensor.dtype == torch.bool:
            tensor.copy_(torch.rand(tensor.shape, generator=generator) < 0.01)
        else:
            tensor.copy_(torch.rand(tensor.shape, generator=generator))
    buffer.size, buffer.pos = buffer.capacity, 0


@torch.no_grad()
def advance(trainer: Trainer, generator: torch.Generator) -> None:
    """A generation's change without its training: every agent tensor moves, and one generation's transitions
    overwrite the buffer from its write position on."""
    for tensor in trainer.population.agent_tensors().values():
        tensor.add_(1e-3)
    buffer, config = trainer.buffer, trainer.config
    count = min(config.evolution.popsize * trainer.rollouts.stored_episodes * config.env.episode_days, buffer.capacity)
    rows = (torch.arange(count) + buffer.pos) % buffer.capacity
    for tensor in buffer.storage.values():
        if tensor.dtype.is_floating_point:
            tensor[rows] = torch.rand((count, *tensor.shape[1:]), generator=generator)
    buffer.pos = (buffer.pos + count) % buffer.capacity


class WrittenBytes:
    """Called after each committed checkpoint: the bytes of the files written for that generation, in ``each``.

    The others are links to a file seen in an earlier generation, which retention may have deleted since (the link
    goes to the generation it deletes next), so every file seen is remembered by its inode and modification time (an
    inode freed by a deletion is used again)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.each: list[int] = []
        self._seen: set[tuple[int, int, int]] = set()

    def __call__(self, generation: int, protect: object = None) -> None:
        def key(st: os.stat_result) -> tuple[int, int, int]:
            return st.st_dev, st.st_ino, st.st_mtime_ns

        files = [entry.stat() for entry in (self.run_dir / checkpoint.generation_dirname(generation)).iterdir()]
        self.each.append(sum(st.st_size for st in files if key(st) not in self._seen))
        self._seen.update(key(st) for st in files)


def row_of(trainer: Trainer) -> dict[str, Any]:
    """A stand-in metrics row (the checkpoint writes it into the history and the metrics file)."""
    return {"generation": trainer.generation, "generation_s": 0.0}


def optimiser_steps(trainer: Trainer) -> dict[str, torch.Tensor]:
    population = trainer.population
    return {
        "actor": population.learner.actor_optim.step_count.cpu(),
        "critic": population.learner.critic_optim.step_count.cpu(),
    }


def synchronous_checkpoint(trainer: Trainer, row: dict[str, Any]) -> None:
    """The loop's checkpoint before staging: written inline from the live tensors."""
    state = trainer.state()
    tensors = {
        "population": state.population,
        **buffer_groups(state.buffer, capacity=trainer.buffer.capacity),
        "rng": state.streams,
    }
    history = [*jsonl.read_rows(trainer.checkpoints.metrics_path), row]
    document = trainer.checkpoints.state_document(state, optimiser_steps(trainer))
    committing.write_generation(
        trainer.run_dir, trainer.generation, tensors=tensors, documents={"state": document, "history": history}
    )
    keep_last = trainer.config.checkpoint.keep_last
    committing.prune_generations(trainer.run_dir, keep_last=keep_last, protect={trainer.champion.generation})
    jsonl.append_row(trainer.checkpoints.metrics_path, row)


def summary(seconds: list[float]) -> dict[str, Any]:
    return {"each_s": seconds, "median_s": statistics.median(seconds), "max_s": max(seconds)}


def measure(config: Config, *, checkpoints: int, train_s: float) -> dict[str, Any]:
    market = load_market(config, torch.device("cpu"))
    with tempfile.TemporaryDirectory(prefix="checkpoint-blocking-") as scratch:
        written = WrittenBytes(Path(scratch))
        trainer = Trainer(config, market, Path(scratch), log=lambda line: None, on_checkpoint=written)
        generator = torch.Generator().manual_seed(0)
        fill_ring(trainer, generator)

        synchronous = []
        for _ in range(checkpoints):
            advance(trainer, generator)
            trainer.generation += 1
            start = time.perf_counter()
            synchronous_checkpoint(trainer, row_of(trainer))
            synchronous.append(time.perf_counter() - start)
            written(trainer.generation)
        folder = trainer.run_dir / checkpoint.generation_dirname(trainer.generation)
        checkpoint_bytes = sum(entry.stat().st_size for entry in folder.iterdir())

        staged = []
        for index in range(checkpoints):
            if index:
                time.sleep(train_s)  # the next generation's training, during which the write goes on
            advance(trainer, generator)
            trainer.generation += 1
            start = time.perf_counter()
            trainer.checkpoints.save(trainer.state(), row_of(trainer))
            staged.append(time.perf_counter() - start)
        start = time.perf_counter()
        trainer.checkpoints.wait()
        final_wait = time.perf_counter() - start
        rows = jsonl.read_rows(trainer.checkpoints.metrics_path)[checkpoints:]
    return {
        "shape": {
            "preset": "paper",
            "device": "cpu",
            "assets": market.num_assets,
            "lookback": config.env.lookback,
            "popsize": config.evolution.popsize,
            "encoder_hidden": config.model.encoder_hidden,
            "buffer_size": config.learner.buffer_size,
            "keep_last": config.checkpoint.keep_last,
        },
        "checkpoint_bytes": checkpoint_bytes,
        "stored_per_generation": config.evolution.popsize * trainer.rollouts.stored_episodes * config.env.episode_days,
        "synchronous_written_bytes": written.each[:checkpoints],
        "staged_written_bytes": written.each[checkpoints:],
        "population_bytes": sum(  # its tensors and the optimisers' step counts, staged with them
            t.numel() * t.element_size()
            for t in [*trainer.population.state_tensors().values(), *optimiser_steps(trainer).values()]
        ),
        "replay_bytes": trainer.buffer.nbytes,
        "staging_bytes": trainer.checkpoints.staging.nbytes,
        "train_s": train_s,
        "synchronous": summary(synchronous),
        "staged": summary(staged),
        "background_write": summary([row["checkpoint_write_s"] for row in rows]),
        "final_wait_s": final_wait,
        "median_ratio": statistics.median(synchronous) / statistics.median(staged),
    }


def report(r: dict[str, Any]) -> str:
    s = r["shape"]

    def line(name: str, figures: dict[str, Any]) -> str:
        each = ", ".join(f"{value:.3f}" for value in figures["each_s"])
        return f"{name:<34} median {figures['median_s']:7.3f} s   max {figures['max_s']:7.3f} s   ({each})"

    return "\n".join(
        [
            f"shape: {s['preset']} preset on {s['device']}: {s['assets']} assets, lookback {s['lookback']}, "
            f"{s['popsize']} agents, encoder {s['encoder_hidden']}, buffer {s['buffer_size']:,} transitions (full), "
            f"keep_last {s['keep_last']}",
            f"a checkpoint: {format_bytes(r['checkpoint_bytes'])} on disk (population "
            f"{format_bytes(r['population_bytes'])}, buffer {format_bytes(r['replay_bytes'])}); staging buffers "
            f"{format_bytes(r['staging_bytes'])}, allocated once",
            f"time between staged checkpoints (stands for training): {r['train_s']:.1f} s",
            "",
            f"bytes written by each checkpoint ({r['stored_per_generation']:,} transitions a generation; the rest "
            "are links to the files of the generation retention deletes next):",
            "  synchronous, the buffer in one file: "
            + ", ".join(format_bytes(b) for b in r["synchronous_written_bytes"]),
            "  staged, the buffer in segments:      " + ", ".join(format_bytes(b) for b in r["staged_written_bytes"]),
            "",
            "the training loop blocks for:",
            line("  synchronous (write_generation)", r["synchronous"]),
            line("  staged (copy + start the write)", r["staged"]),
            f"  ratio of the medians: {r['median_ratio']:.1f}x",
            "",
            line("the background write itself", r["background_write"]),
            f"the wait at the end of the run for the last write: {r['final_wait_s']:.3f} s",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoints each way (default 5)")
    parser.add_argument(
        "--train-s", type=float, default=10.0, help="seconds between staged checkpoints, for training (default 10)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = parser.parse_args(argv)
    config = paper_config(parse_assignments(args.set))
    result = measure(config, checkpoints=args.checkpoints, train_s=args.train_s)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
