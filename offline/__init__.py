"""The offline commands and what only they use: ``inspect`` (inspection), ``evaluate`` (holdout scoring against
baselines, risk ratios, overfitting diagnostics, plots), ``export`` and ``backtest``. Nothing here runs while a
run trains."""
