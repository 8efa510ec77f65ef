"""``python main.py evaluate``: a real smoke checkpoint, its export, and bad targets."""

from __future__ import annotations

import csv
import html
import json
import math
import shutil
import statistics

import matplotlib.image
import pytest

import main
from offline import evaluate as report_module
from offline.export import export_champion
from offline.holdout import RANGES
from offline.plots import HISTORY_SIZE_PX, REPORT_SIZE_PX
from persistence import checkpoint

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STRATEGIES = {"champion", "untrained", "equal_weight", "buy_and_hold", "cash", "index"}


@pytest.fixture(scope="module")
def report(smoke_run, tmp_path_factory):
    """The report of the smoke run's newest generation, written into a copy of the run."""
    run = tmp_path_factory.mktemp("evaluate") / "r"
    shutil.copytree(smoke_run, run)
    assert main.main(["evaluate", str(run)]) == 0
    return run, run / "evaluation" / "gen-000003"


def test_report_files(report):
    _, out = report
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "evaluation.json",
            "evaluation.csv",
            "daily.csv",
            "weights.csv",
            "equity.png",
            "drawdowns.png",
            "weights.png",
            "history.png",
            "report.html",
        ]
    )
    for name in ("equity.png", "drawdowns.png", "weights.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        height, width, _ = matplotlib.image.imread(out / name).shape
        assert (width, height) == REPORT_SIZE_PX
    height, width, _ = matplotlib.image.imread(out / "history.png").shape
    assert (width, height) == HISTORY_SIZE_PX


def test_every_figure_is_in_the_json_and_the_csv(report):
    _, out = report
    document = json.loads((out / "evaluation.json").read_text())
    assert set(document["ranges"]) == set(RANGES)
    rows = list(csv.DictReader((out / "evaluation.csv").open()))
    assert len(rows) == len(RANGES) * len(STRATEGIES)
    for row in rows:
        figures = document["ranges"][row["range"]]["metrics"][row["strategy"]]
        empty = {key for key in report_module.EXPOSURE_COLUMNS if row[key] == ""}  # the index holds no weights
        assert empty == (set(report_module.EXPOSURE_COLUMNS) if row["strategy"] == "index" else set())
        assert set(figures) == set(row) - {"range", "strategy"} - empty
        for key, value in figures.items():
            if isinstance(value, bool):  # under_a_year: 1 or 0 in the CSV
                assert row[key] == str(int(value))
            else:
                assert (row[key] == "") if value is None else float(row[key]) == pytest.approx(value)
    for name in RANGES:
        assert set(document["ranges"][name]["metrics"]) == STRATEGIES
        cash = document["ranges"][name]["metrics"]["cash"]
        assert cash["total_return"] == 0 and cash["sharpe"] is None
    daily = list(csv.DictReader((out / "daily.csv").open()))
    holdout = document["ranges"]["holdout"]
    days = [row for row in daily if row["range"] == "holdout"]
    assert days[0]["date"] == holdout["first_day"] and days[-1]["date"] == holdout["last_day"]
    total = sum(float(row["champion_log_return"]) for row in days)
    assert holdout["metrics"]["champion"]["total_return"] == pytest.approx(math.expm1(total), rel=1e-9)


def test_the_tear_sheet_reads_the_run(report):
    """report.html holds the run's figures: every strategy by its label, the bundled index by what it is, the
    selection verdict and both diagnostics, each range's days (126: annualised from 126 days, no Calmar)."""
    _, out = report
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    document = json.loads((out / "evaluation.json").read_text())
    assert page.startswith("<!DOCTYPE html>") and "Tear sheet: champion of " in page
    for label in document["strategies"].values():
        assert f"<th>{label}</th>" in page
    assert document["strategies"]["index"] == "S&P 500 price index (no dividends)"
    assert document["selection"] in page
    assert document["diagnostics"]["deflated_sharpe_reading"] in page and document["diagnostics"]["pbo_reading"] in page
    for name in RANGES:
        assert f"{document['ranges'][name]['first_day']} to {document['ranges'][name]['last_day']}" in page
    assert "annualised from 126 days" in page and "Calmar is not shown" in page


def test_the_champion_scores_on_validation_what_training_measured(report):
    """Evaluation reruns the champion on the validation windows training used: the same total log return."""
    run, out = report
    state = checkpoint.read_document(checkpoint.open_generation(run / "gen-000003"), "state")
    days = [row for row in csv.DictReader((out / "daily.csv").open()) if row["range"] == "validation"]
    total = sum(float(row["champion_log_return"]) for row in days)
    assert total == pytest.approx(state["champion_score"], abs=1e-5)


def test_an_export_evaluates_like_its_checkpoint(report, tmp_path):
    run, out = report
    exported = export_champion(run, tmp_path / "actor", log=lambda line: None)
    assert main.main(["evaluate", str(exported), "--out", str(tmp_path / "report")]) == 0
    mine = json.loads((tmp_path / "report" / "evaluation.json").read_text())["ranges"]
    theirs = json.loads((out / "evaluation.json").read_text())["ranges"]
    assert mine == theirs
    assert not (tmp_path / "report" / "history.png").exists()  # an export has no history
    diagnostics = json.loads((tmp_path / "report" / "evaluation.json").read_text())["diagnostics"]
    assert diagnostics["deflated_sharpe"] is None and diagnostics["pbo"] is None
    assert diagnostics["deflated_sharpe_reading"] == "deflated Sharpe n/a (an export has no run history)"
    assert diagnostics["pbo_reading"] == "PBO n/a (an export has no run history)"


@pytest.mark.slow
def test_printed_table_and_json(report, capsys):
    run, _ = report
    assert main.main(["evaluate", str(run / "gen-000003"), "--out", str(run / "again")]) == 0
    printed = capsys.readouterr().out
    for word in ("holdout", "validation", "champion", "untrained (same seed)", "Sharpe", "max DD", "report: "):
        assert word in printed
    assert printed.rstrip().endswith("history.png, report.html)")  # the tear sheet among the written files
    # The two diagnostics, after the tables: figures, or n/a with the reason (a run that did not record them); then
    # what the selection gate concluded (the fixture crowns an agent in every generation).
    lines = printed.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("deflated Sharpe "))
    assert lines[first + 1].startswith("PBO ") and lines[first + 4].startswith("report: ")
    assert lines[first + 2].startswith("selection: the champion was proven in generation 3; ")
    assert main.main(["evaluate", str(run), "--json", "--out", str(run / "again")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["source"]["generation"] == 3
    assert document["diagnostics"]["deflated_sharpe_reading"] == lines[first]
    assert document["diagnostics"]["pbo_reading"] == lines[first + 1]
    assert document["selection"] == lines[first + 2].removeprefix("selection: ")


@pytest.mark.slow
@pytest.mark.parametrize("rows", ["recorded", "older"])
def test_diagnostics_come_from_the_run_history(report, tmp_path, monkeypatch, capsys, add_validation_keys, rows):
    """The trials are the history's agents (3 generations of 4); the champion's Sharpe ratio is its validation
    excess over equal weight as evaluated. Rows without the keys (an earlier version's run) give n/a."""
    run, _ = report
    load = report_module.load_champion

    def with_history(target, scratch, **options):
        champion = load(target, scratch, **options)
        history = [{k: v for k, v in row.items() if not k.startswith("validation_")} for row in champion.history]
        champion.history = add_validation_keys(history, popsize=4, seed=5) if rows == "recorded" else history
        return champion

    monkeypatch.setattr(report_module, "load_champion", with_history)
    assert main.main(["evaluate", str(run), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    diagnostics = json.loads((tmp_path / "out" / "evaluation.json").read_text())["diagnostics"]
    assert diagnostics["deflated_sharpe_reading"] in printed and diagnostics["pbo_reading"] in printed
    if rows == "older":
        assert diagnostics["deflated_sharpe"] is None and diagnostics["pbo"] is None
        assert diagnostics["pbo_reading"].startswith("PBO n/a (3 of 3 generations were recorded without")
        return
    assert diagnostics["trials"] == 12 and diagnostics["deflated_sharpe_of"] == "champion"  # smoke_run crowns
    assert 0.0 <= diagnostics["deflated_sharpe"] <= 1.0 and 0.0 <= diagnostics["pbo"] <= 1.0
    assert diagnostics["pbo_splits"] == 12870
    days = [row for row in csv.DictReader((tmp_path / "out" / "daily.csv").open()) if row["range"] == "validation"]
    excess = [float(row["champion_log_return"]) - float(row["equal_weight_log_return"]) for row in days]
    assert diagnostics["days"] == len(days)
    assert diagnostics["sharpe"] == pytest.approx(statistics.fmean(excess) / statistics.stdev(excess), rel=1e-9)


@pytest.mark.parametrize(
    "args, message",
    [
        (["/nonexistent/run"], "/nonexistent/run"),
        (["--no-such-flag", "x"], "unrecognized arguments"),
        ([], "target"),
    ],
)
def test_bad_targets_are_one_line_errors(args, message, capsys):
    assert main.main(["evaluate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_a_damaged_generation_is_refused(report, tmp_path, capsys):
    run, _ = report
    copy = tmp_path / "r"
    shutil.copytree(run / "gen-000003", copy / "gen-000003")
    population = copy / "gen-000003" / "population.safetensors"
    data = bytearray(population.read_bytes())
    data[-1] ^= 0xFF
    population.write_bytes(bytes(data))
    assert main.main(["evaluate", str(copy / "gen-000003")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "damaged" in err
    assert not (copy / "evaluation").exists()


@pytest.mark.slow
def test_tensorboard_flag_writes_the_figures(report, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = report
    assert main.main(["evaluate", str(run), "--out", str(tmp_path / "tb"), "--tensorboard"]) == 0
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert {"evaluation/equity", "evaluation/drawdowns", "evaluation/weights"} <= set(events.Tags()["images"])


def test_missing_tensorboard_is_refused_before_any_work(report, tmp_path, monkeypatch, capsys):
    import utils.tensorboard

    monkeypatch.setattr(utils.tensorboard, "tensorboard_available", lambda: False)
    run, _ = report
    assert main.main(["evaluate", str(run), "--out", str(tmp_path / "x"), "--tensorboard"]) == 2
    assert "pip install tensorboard" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
