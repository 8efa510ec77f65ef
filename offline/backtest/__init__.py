"""``python main.py backtest``: the walk-forward evidence of whether learning holds up.

For each of K test years (by default the last K calendar years of the data) and each seed, a fresh run trains on
everything before that year: its training range, then its own validation range (which chooses the champion), then a
gap of ``env.lookback + env.execution_delay`` days that nothing trades, so the first test decision's observation
window holds no day that training or validation earned. The test year is the run's holdout. The champion is then
scored on the test year with the baselines of ``python main.py evaluate`` (equal weight rebalanced daily and held,
the untrained population of the same seed, the index, cash), one episode from cash with the same costs.

Every fold is an ordinary run folder ``NAME/fold-YEAR-seed-S`` (checkpointed every generation and resumable); its
scores go to ``NAME/folds/fold-YEAR-seed-S.json`` once it is done. Running the same command again continues a
killed backtest where it stopped: finished folds are read back, an unfinished one resumes from its last checkpoint
(bit for bit), so the table is the same as an uninterrupted backtest's. ``NAME/plan.json`` holds what the backtest
was asked; the same name with a different plan is refused, naming the first difference. A summary describes one plan
on one market: each fold result records the fingerprint of the market it was trained on (``market_fingerprint``;
a fold without one, finished by an earlier version or not yet finished, is checked against its run's checkpoint), and
a backtest whose data no longer gives every fold that market is refused before anything is trained or written.
Fold results are read back only after every key the summary reads has been checked; a damaged one is recomputed from
the fold's run when that run has a checkpoint, else refused with what to do.

Folds are independent runs: ``--jobs N`` trains N at once, each in a worker process of its own
(``offline.backtest.workers``), and under ``torchrun`` the folds are spread over the job's processes, the leader
writing the report (``offline.backtest.spread``). Every fold runs with ``--threads`` torch threads whatever N
(``offline.backtest.placement``: a fold's figures on the CPU depend on its threads), so the fold results, summary and
table are those of one fold at a time, bit for bit; ``offline.backtest.progress`` shows every running fold.

The summary: per fold and seed the champion's Sharpe against equal weight's, and over all of them the mean and
spread of the Sharpe difference, the fraction of folds the champion won (and tied: an equal-weight champion ties),
and the champion's turnover over equal weight's. Each fold also carries the overfitting diagnostics of its run's
choice on its validation range (``offline.overfitting``: deflated Sharpe ratio and PBO); the summary gives how
many folds crowned an agent and the mean of both. Those are descriptions; the inference is one test over every test
day (``offline.backtest.inference``): the champion's daily excess over equal weight, seeds averaged per day and the
test years chained, its mean tested against 0 by a stationary bootstrap, with a one-sentence verdict (edge proven, no
edge, or cannot tell yet and how many test years would tell) and the deflated Sharpe ratio over every trial.
"""

from offline.backtest.command import main

__all__ = ["main"]
