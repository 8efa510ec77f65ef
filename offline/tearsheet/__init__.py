"""``report.html``: the tear sheet of a champion against every baseline, one self-contained page.

``evaluation.json`` and the CSVs hold every figure and the PNGs show three of them; a practitioner reads a strategy
from a tear sheet (pyfolio's and quantstats', as users of FinRL and qlib do): equity against the alternatives, the
worst drawdowns and how long they lasted, rolling risk-adjusted return, calendar returns, what the strategy held and
traded, its exposure to the benchmark, and whether choosing it was skill or luck. This page puts those in one place,
for ``evaluate`` (the holdout, out of sample, and the validation range that chose the champion) and for ``backtest``
(the test years chained per seed, with the summary's figures).

The page is one file that opens offline with nothing else: every figure is a PNG drawn on a matplotlib ``Figure``
with the Agg canvas (``offline.plots``, never pyplot) and inlined as base64, the style sheet is inline, and nothing
is fetched (no script, font, image or style sheet from anywhere; the fonts are the reader's own).

Figures are ``offline.risk``'s (the summary table is ``risk_metrics``, the same numbers as ``evaluation.json``) and
``offline.performance``'s. A figure annualised from fewer than a year of days says so, and Calmar is not shown for
such samples (``offline.performance.annualised``, ``CALMAR_MIN_DAYS``).

The package, by reader: ``sheet`` (what a page is made of and how a figure reads), ``tables`` and ``sections`` (one
part's tables and sections), ``page`` (the HTML), ``evaluation`` and ``backtest`` (each command's page).
"""

from offline.tearsheet.backtest import backtest_sheet, backtest_verdict
from offline.tearsheet.evaluation import evaluation_sheet
from offline.tearsheet.page import render, write_page
from offline.tearsheet.sections import distribution_table, exposure_series, identical_to_champion, month_grid
from offline.tearsheet.sheet import DEFINITIONS, PAGE, SECTIONS, Part, Sheet, Table, Verdict
from offline.tearsheet.tables import (
    drawdown_table,
    monthly_table,
    relative_table,
    summary_table,
    yearly_table,
)

__all__ = [
    "DEFINITIONS",
    "PAGE",
    "SECTIONS",
    "Part",
    "Sheet",
    "Table",
    "Verdict",
    "backtest_sheet",
    "backtest_verdict",
    "distribution_table",
    "drawdown_table",
    "evaluation_sheet",
    "exposure_series",
    "identical_to_champion",
    "month_grid",
    "monthly_table",
    "relative_table",
    "render",
    "summary_table",
    "write_page",
    "yearly_table",
]
