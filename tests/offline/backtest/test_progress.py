"""What a backtest shows while it runs (``offline.backtest.progress``): the folds done over the total, every running
fold's generation beside the bar, the leader showing the other processes' folds with its own."""

from __future__ import annotations

from offline.backtest.plan import plan_folds
from offline.backtest.progress import FoldBoard, result_line
from tests.offline.backtest.builders import fold_result, small_config


class Bar:
    """What a ``GenerationProgress`` was told: the count of folds done and the text beside the bar."""

    def __init__(self) -> None:
        self.done, self.text = 0, ""

    def update(self) -> None:
        self.done += 1

    def describe(self, text: str) -> None:
        self.text = text


def test_the_bar_shows_every_running_fold_and_the_folds_done(prices):
    first, second, third = plan_folds(small_config(prices), seeds=[0, 1, 2], folds=1)
    bar, lines = Bar(), []
    board = FoldBoard(bar, say=lines.append, verbose=True)
    board.started(first)
    board.started(second)
    board.generation(first, 2)
    board.log(second, "gen    1/3 | ...")
    assert bar.text == "fold-2005-seed-0 gen 2/3, fold-2005-seed-1 starting"
    assert lines == ["fold-2005-seed-1: gen    1/3 | ..."]  # --verbose: the fold's lines, prefixed by the fold
    result = fold_result(2005)
    board.finished(first, result)
    assert bar.done == 1 and board.done == 1 and bar.text == "fold-2005-seed-1 starting"
    assert lines[-1] == result_line("fold-2005-seed-0", result)
    board.left(second)
    assert bar.text == ""

    # The leader shows another process's lines and folds beside its own.
    board.started(third)
    board.elsewhere(["fold-2005-seed-1: done elsewhere"], {"fold-2004-seed-0": "gen 5/3"}, done=2)
    assert bar.done == 3 and lines[-1] == "fold-2005-seed-1: done elsewhere"
    assert bar.text == "fold-2005-seed-2 starting, fold-2004-seed-0 gen 5/3"
    board.elsewhere([], {}, done=2)
    assert bar.done == 3 and bar.text == "fold-2005-seed-2 starting"


def test_a_process_that_is_not_the_leader_keeps_its_lines_for_the_leader(prices):
    [fold] = plan_folds(small_config(prices), seeds=[0], folds=1)
    lines: list[str] = []
    board = FoldBoard(Bar(), say=lines.append, verbose=False, speaks=False)
    board.log(fold, "not verbose: not kept")
    board.finished(fold, fold_result(2005))
    assert lines == [] and board.outbox == [result_line(fold.name, fold_result(2005))]
