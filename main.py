"""Command line of the evolutionary (ERL) actor-critic trading trainer.

    python main.py [--preset smoke|default|paper] [--set key=value ...] [flags]   train
    python main.py --resume [--generations N]                                     continue the latest run
    python main.py --resume-or-start --fall-back --run-name NAME [flags]          a pod's start command
    python main.py inspect TARGET [--json] [--plot FILE]                          read a checkpoint
    python main.py evaluate TARGET [--out DIR] [--json] [--tensorboard]           holdout report with baselines
    python main.py export TARGET OUT_DIR                                          write the champion's actor
    python main.py trade TARGET --data FILE [--holdings FILE | --since DATE]      the next orders (orders.csv)
    python main.py backtest [--seeds 0,1,2] [--folds 4] [--jobs N] [flags]        walk-forward backtest
    torchrun --nproc_per_node=W main.py [backtest] [flags]                        over W processes (one per GPU)

Bad input (flags, config, data, checkpoints) ends with a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from typing import Any, NoReturn

import config as config_module
from persistence import run_folder
from utils.errors import InputError

EXIT_BAD_INPUT = 2
SINGLE_PROCESS_COMMANDS = ("inspect", "evaluate", "export", "trade")
"""Commands that never shard: under torchrun with several processes they are refused."""
FINAL_UPLOAD_TIMEOUT_S = 600.0
"""Longest wait for the last uploads of a finished run; what did not arrive stays in the local copy."""
STOP_UPLOAD_GRACE_S = 20.0
"""Seconds a stopped run spends uploading its last checkpoint (pods give about 30 s after SIGTERM)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise InputError(f"{message} (see python main.py --help)")


COMMANDS = {
    "inspect": "inspect TARGET [--json] [--plot FILE]: a run or generation's history, champion and integrity",
    "evaluate": "evaluate TARGET [--out DIR] [--json]: the champion on the holdout against the baselines",
    "backtest": "backtest [--seeds 0,1,2] [--folds N]: walk-forward runs, one per test year and seed",
    "export": "export TARGET OUT_DIR: the champion's actor for use elsewhere",
    "trade": "trade TARGET --data FILE [--holdings FILE | --since DATE]: the champion's next orders (orders.csv)",
}
"""The commands beside training, each with ``python main.py COMMAND --help`` of its own."""


def _train_parser() -> argparse.ArgumentParser:
    keys = "\n".join(f"  {key:<34} {doc}" for key, doc in config_module.field_docs().items())
    commands = "\n".join(f"  python main.py {line}" for line in COMMANDS.values())
    parser = _Parser(
        prog="python main.py",
        description="Evolve a population of actor-critic (DDPG or TD3) trading agents on daily market data.\n\n"
        f"Without a command it trains; the other commands:\n{commands}",
        epilog=f"config keys for --set:\n{keys}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_module.add_run_flags(parser)
    parser.add_argument("--seed", type=int, help="seed of every random stream")
    parser.add_argument(
        "--checkpoint-uri", help="where runs live: a folder or gs://bucket/prefix (env ERL_CHECKPOINT_URI)"
    )
    parser.add_argument("--run-name", help="the run's folder name (default: a timestamp)")
    parser.add_argument("--local-dir", help="local write-ahead copy of gs:// runs (default: runs)")
    parser.add_argument("--resume", action="store_true", help="continue the most recent run (or --run-name)")
    parser.add_argument(
        "--resume-or-start",
        action="store_true",
        help="with --run-name: resume the run if it has a complete generation (locally or in the bucket), else start "
        "it; safe to run on every pod start",
    )
    parser.add_argument(
        "--resume-from", type=int, metavar="GEN", help="with --resume: continue from this complete generation"
    )
    parser.add_argument(
        "--fall-back",
        action="store_true",
        help="with --resume or --resume-or-start: when the newest generations are damaged, set them aside "
        "(gen-NNNNNN.damaged-TIME, never deleted) and continue from the newest intact one instead of refusing",
    )
    # Its value is runtime.progress's: False when given, None (nothing named) when not.
    parser.add_argument("--no-progress", action="store_const", const=False, help="no progress bar")
    parser.add_argument(
        "--tensorboard", action="store_true", help="also log every generation to <run>/tensorboard (needs tensorboard)"
    )
    return parser


TRAIN_FLAGS = {
    **config_module.RUN_FLAGS,
    "--seed": "runtime.seed",
    "--checkpoint-uri": "checkpoint.uri",
    "--run-name": "checkpoint.run_name",
    "--local-dir": "checkpoint.local_dir",
    "--no-progress": "runtime.progress",
}
"""The train command's flags that set a config key."""


def _explicit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The dotted config settings the user named, flags and --set alike."""
    settings = config_module.flag_settings(args, TRAIN_FLAGS)
    if "checkpoint.uri" not in settings and os.environ.get("ERL_CHECKPOINT_URI"):  # the command line wins
        settings["checkpoint.uri"] = os.environ["ERL_CHECKPOINT_URI"]
    return settings


def train(argv: list[str]) -> int:
    args = _train_parser().parse_args(argv)
    base = config_module.preset(args.preset)
    settings = _explicit_settings(args)
    _check_resume_flags(args)
    config = config_module.override(base, settings)
    # Typed values of what the user named, for comparison with a resumed run's config.
    explicit = {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in settings}

    from persistence.checkpoint import generation_dirname
    from run.launch import resume_or_start, resume_run, start_run  # heavy imports after the flags are known good
    from run.trainer import RunStopped
    from runtime.sharding import Ranks
    from utils.progress import GenerationProgress
    from utils.signals import StopRequest
    from utils.tensorboard import MISSING_MESSAGE, TensorBoardLog, tensorboard_available

    if args.tensorboard and not tensorboard_available():
        raise InputError(MISSING_MESSAGE)
    with contextlib.ExitStack() as stack:
        # Under torchrun, one process of several: the leader speaks, writes and uploads (runtime.sharding).
        ranks = Ranks.connect(timeout_s=config.runtime.collective_timeout_s) if Ranks.launched() else Ranks()
        stack.callback(ranks.close)
        stop = stack.enter_context(StopRequest())
        progress = stack.enter_context(GenerationProgress(enabled=config.runtime.progress and ranks.is_leader))
        log = progress.write if ranks.is_leader else _quiet
        if args.resume_or_start:
            run = resume_or_start(config, explicit, log=log, should_stop=stop, fall_back=args.fall_back, ranks=ranks)
        elif args.resume:
            run = resume_run(
                config,
                explicit,
                log=log,
                should_stop=stop,
                resume_from=args.resume_from,
                fall_back=args.fall_back,
                ranks=ranks,
            )
        else:
            run = start_run(config, log=log, should_stop=stop, ranks=ranks)
        trainer, config = run.trainer, run.config
        board = None
        if args.tensorboard and ranks.is_leader:  # a resumed run hides what it logged past the checkpoint
            board = stack.enter_context(
                TensorBoardLog(trainer.run_dir / run_folder.TENSORBOARD_NAME, purge_step=trainer.generation + 1)
            )

        def on_generation(row: dict[str, Any]) -> None:
            if board is not None:
                board.generation(row)
            progress.update()

        progress.reset(total=config.runtime.generations, initial=trainer.generation)
        try:
            trainer.run(until=config.runtime.generations, on_generation=on_generation)
        except RunStopped as stopped:
            ranks.close()  # every rank stopped at the same vote: as below, the uploads run outside the group
            progress.close()
            # A pre-empted pod has seconds, not minutes: upload what fits, the local copy keeps the rest.
            uploaded = run.finish(timeout=STOP_UPLOAD_GRACE_S, progress=config.runtime.progress)
            log(
                f"stopped by {stop.name or 'a signal to another process'} after generation {stopped.generation}; "
                f"the last complete checkpoint is "
                f"{trainer.run_dir / generation_dirname(stopped.generation)}{_line(uploaded)}. Resume with:\n"
                f"  {_resume_command(trainer)}"
            )
            return 128 + (stop.signum or 0)
        # Every rank is past its last collective (checkpoints are gathered on this thread, and the last write is
        # done): leave the group now, so that the leader's uploads (minutes) run outside it, with no peer to wait on
        # or to fail with.
        ranks.close()
        progress.close()
        uploaded = run.finish(timeout=FINAL_UPLOAD_TIMEOUT_S, progress=config.runtime.progress)
    log(f"done: {trainer.run_dir} at generation {trainer.generation}{_line(uploaded)}")
    return 0


def _check_resume_flags(args: argparse.Namespace) -> None:
    """An InputError for resume flags that do not go together."""
    if args.resume_from is not None and not args.resume:
        raise InputError("--resume-from needs --resume")
    if args.resume_or_start and (args.resume or not args.run_name):
        raise InputError("--resume-or-start needs --run-name and no --resume (it resumes by itself when it can)")
    if args.fall_back and not (args.resume or args.resume_or_start):
        raise InputError("--fall-back needs --resume or --resume-or-start (a new run has nothing to fall back to)")
    if args.fall_back and args.resume_from is not None:
        raise InputError("--resume-from names the generation to continue from; give it or --fall-back, not both")


def _quiet(line: str) -> None:
    """Where a process other than the leader sends its lines: the leader's say the same."""


def _line(summary: str) -> str:
    return f"; {summary}" if summary else ""


def _resume_command(trainer: Any) -> str:
    cfg = trainer.config.checkpoint
    words = ["python", "main.py", "--resume", "--checkpoint-uri", cfg.uri, "--run-name", cfg.run_name]
    return " ".join(shlex.quote(word) for word in words)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["help"]:  # `python main.py help [COMMAND]`, as `--help`
        argv = [*argv[1:2], "--help"] if argv[1:2] and argv[1] in COMMANDS else ["--help"]
    try:
        if argv and argv[0] in SINGLE_PROCESS_COMMANDS and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise InputError(f"{argv[0]} runs in one process: start it with python, not torchrun")
        if argv and argv[0] == "inspect":
            from offline import inspection

            return inspection.main(argv[1:])
        if argv and argv[0] == "evaluate":
            from offline import evaluate

            return evaluate.main(argv[1:])
        if argv and argv[0] == "export":
            from offline import export

            return export.main(argv[1:])
        if argv and argv[0] == "trade":
            from offline import trade

            return trade.main(argv[1:])
        if argv and argv[0] == "backtest":
            from offline import backtest

            return backtest.main(argv[1:])
        return train(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def exit_process(code: int) -> NoReturn:
    """End this process with ``code``. A process of a torchrun job ends once its work is written and its output
    flushed, without the interpreter's teardown: there, torch's C++ threads of a finished job have aborted a process
    (SIGABRT, "terminate called without an active exception", about once in 20 two-process runs on the CPU), which
    torchrun reports as a failed job and answers by stopping the others. One process ends as any program does."""
    if "RANK" in os.environ:  # torch is imported by then; a single process never imports it here
        from runtime.sharding import Ranks

        if Ranks.launched():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
