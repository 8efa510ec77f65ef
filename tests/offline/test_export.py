"""``python main.py export``: the champion's actor runs with plain PyTorch exactly as it ran in training."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import main
from config import Config
from environment import loading as setup
from environment.features import WARMUP_DAYS, build_market, raw_features
from environment.observation import Observation, WindowGatherer
from environment.prices import load_prices
from models.networks import Actor
from offline import bundle, export
from persistence import checkpoint


def export_cli(capsys, *args) -> tuple[int, str, str]:
    status = main.main(["export", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(capsys, args: list, *phrases: str) -> None:
    status, out, err = export_cli(capsys, *args)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for phrase in phrases:
        assert phrase in lines[0]


@pytest.fixture(scope="module")
def exported(smoke_run, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("export") / "actor"
    assert main.main(["export", str(smoke_run), str(out_dir)]) == 0
    return out_dir


@pytest.fixture(scope="module")
def trained(smoke_run):
    """The run's state, config, price table and market, rebuilt here independently of the exporter."""
    gen = checkpoint.open_generation(smoke_run)
    state = checkpoint.read_document(gen, "state")
    config = Config.from_dict(state["config"])
    data = config.data
    table = load_prices(
        None,
        tickers=data.tickers,
        start=data.start,
        end=data.end,
        max_fill_days=data.max_fill_days,
        max_assets=data.max_assets,
    )
    market = build_market(
        table,
        lookback=config.env.lookback,
        episode_days=config.env.episode_days,
        validation_days=data.validation_days,
        holdout_days=data.holdout_days,
    )
    return gen, state, config, table, market


def readme_namespace(out_dir: Path) -> dict:
    """The README's first Python block, executed in a namespace that holds only torch."""
    readme = (out_dir / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.DOTALL).group(1)
    namespace = {"torch": torch}
    exec(compile(code, str(out_dir / "README.md"), "exec"), namespace)
    return namespace


def project_champion(gen, config: Config, window_size: int) -> Actor:
    actor = Actor(1, window_size, config.model)
    tensors = checkpoint.read_tensors(gen, "population")
    actor.load_state_dict({name: tensors[f"champion.{name}"] for name, _ in actor.named_parameters()})
    return actor


def test_export_writes_the_three_files(capsys, exported, smoke_run, trained):
    gen, state, config, _, market = trained
    assert sorted(p.name for p in exported.iterdir()) == ["README.md", "actor.json", "actor.safetensors"]
    params = safetensors.torch.load_file(str(exported / "actor.safetensors"))
    population = checkpoint.read_tensors(gen, "population")
    champion = {k.removeprefix("champion."): t for k, t in population.items() if k.startswith("champion.")}
    assert set(params) == set(champion)
    for name, tensor in params.items():
        assert torch.equal(tensor, champion[name][0])  # the population dimension squeezed
    assert params["encoder.mlp.layers.0.weight"].shape == (config.env.lookback * market.num_features, 16)

    spec = json.loads((exported / "actor.json").read_text())
    num_assets, num_features = market.num_assets, market.num_features
    assert spec["tickers"] == state["tickers"] == list(market.tickers)
    assert spec["feature_names"] == list(market.feature_names)
    assert spec["lookback"] == config.env.lookback and spec["warmup_days"] == WARMUP_DAYS
    assert spec["observation"]["windows"]["shape"] == [num_assets, config.env.lookback * num_features]
    assert spec["observation"]["weights"]["shape"] == [num_assets + 1]
    assert "cash first" in spec["observation"]["weights"]["layout"]
    assert spec["cost_rate"] == config.env.cost_rate
    assert np.array(spec["normalisation"]["mean"]).shape == (num_assets, num_features)
    assert torch.equal(torch.tensor(spec["normalisation"]["mean"]), market.feature_mean)
    assert torch.equal(torch.tensor(spec["normalisation"]["std"]), market.feature_std)
    assert spec["champion_score"] == state["champion_score"] and spec["champion_bound"] == state["champion_bound"]
    assert spec["champion_generation"] == state["champion_generation"]
    assert spec["generation"] == 3
    assert spec["source"]["run_dir"] == str(smoke_run) and spec["source"]["config"] == state["config"]
    assert spec["architecture"]["tensors"] == {name: list(t.shape) for name, t in params.items()}
    assert spec["precision"] == "float32" and spec["format_version"] == bundle.VERSION
    assert spec["training_precision"]["bf16_encoder"] is False  # tests/offline/test_precision.py: a bf16 run


def test_readme_code_reproduces_the_actor(exported, trained):
    gen, _, config, table, market = trained
    lookback = config.env.lookback
    namespace = readme_namespace(exported)
    params, spec = namespace["load_actor"](exported)

    # Real observation windows: days across train, validation and holdout; all-cash and random weights.
    days = torch.tensor([lookback - 1, 500, market.splits.validation.start, market.num_days - 2])
    windows = WindowGatherer(market.features, lookback).gather(days)  # (M, N, L * K)
    generator = torch.Generator().manual_seed(0)
    weights = torch.softmax(3 * torch.randn(len(days), market.num_assets + 1, generator=generator), dim=-1)
    weights[0] = 0
    weights[0, 0] = 1  # a new portfolio: all cash

    actor = project_champion(gen, config, windows.shape[-1])
    with torch.no_grad():
        expected = actor(Observation(windows.unsqueeze(0), weights.unsqueeze(0)))[0]  # (M, N + 1)
        got = namespace["target_weights"](params, windows, weights)
        one = namespace["target_weights"](params, windows[1], weights[1])  # no batch dimension
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(one, expected[1], atol=1e-5, rtol=0)
    assert not torch.allclose(expected[0], expected[1])  # the windows matter

    # The README's observation pipeline from raw prices gives the windows the trainer saw.
    raw = torch.from_numpy(raw_features(table.prices)[WARMUP_DAYS:]).float()  # (T, N, K)
    for row, day in enumerate(days.tolist()):
        normalised = namespace["normalise"](raw[day - lookback + 1 : day + 1], spec)
        torch.testing.assert_close(namespace["window"](normalised), windows[row], atol=1e-4, rtol=0)


def test_refuses_a_non_empty_out_dir(capsys, smoke_run, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    assert_one_line_error(capsys, [smoke_run, out_dir], str(out_dir), "not empty")
    assert [p.name for p in out_dir.iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    assert_one_line_error(capsys, [smoke_run, tmp_path / "file"], "not a folder")


def test_an_empty_out_dir_is_used(capsys, smoke_run, tmp_path):
    out_dir = tmp_path / "empty"
    out_dir.mkdir()
    status, out, err = export_cli(capsys, smoke_run / "gen-000002", out_dir)
    assert status == 0 and err == ""
    assert str(out_dir) in out and "gen-000002" in out
    assert json.loads((out_dir / "actor.json").read_text())["generation"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no temporary folder left


def test_changed_data_is_refused(capsys, smoke_run, tmp_path, monkeypatch):
    def shifted(*args, **kwargs):
        table = load_prices(*args, **kwargs)
        prices = table.prices.copy()
        prices[-1, 0] *= 1.01
        return type(table)(dates=table.dates, tickers=table.tickers, prices=prices, benchmark=table.benchmark)

    monkeypatch.setattr(setup, "load_prices", shifted)
    assert_one_line_error(capsys, [smoke_run, tmp_path / "out"], "data changed")
    assert not (tmp_path / "out").exists()


def test_damaged_checkpoints_are_refused(capsys, smoke_run, tmp_path):
    run_dir = Path(shutil.copytree(smoke_run, tmp_path / "r"))
    population = run_dir / "gen-000003" / "population.safetensors"
    data = bytearray(population.read_bytes())
    data[-5] ^= 0xFF
    population.write_bytes(bytes(data))
    assert_one_line_error(capsys, [run_dir / "gen-000003", tmp_path / "out"], "damaged", str(population))
    assert_one_line_error(capsys, [tmp_path / "missing", tmp_path / "out"], "no checkpoint")
    assert not (tmp_path / "out").exists()
    # A run folder falls back to its newest intact generation, as inspect does.
    assert export.export_champion(run_dir, tmp_path / "out", log=lambda line: None) == tmp_path / "out"
    assert json.loads((tmp_path / "out" / "actor.json").read_text())["generation"] == 2


def test_an_equal_weight_champion_exports_an_actor_that_holds_equal_weight(capsys, monkeypatch, tmp_path):
    """A run whose agents never proved an edge keeps the equal-weight champion; that is what it exports."""
    monkeypatch.setattr("training.loop.choose_champion", lambda edges, *_, **__: None)
    argv = ["--preset", "smoke", "--checkpoint-uri", str(tmp_path), "--run-name", "ew", "--no-progress"]
    assert main.main([*argv, "--generations", "1"]) == 0
    status, out, _ = export_cli(capsys, tmp_path / "ew", tmp_path / "out")
    assert status == 0 and "equal weight" in out
    assert "equal weight: no agent's edge" in (tmp_path / "out" / "README.md").read_text()
    namespace = readme_namespace(tmp_path / "out")
    params = safetensors.torch.load_file(str(tmp_path / "out" / "actor.safetensors"))
    spec = json.loads((tmp_path / "out" / "actor.json").read_text())
    num_assets = len(spec["tickers"])
    generator = torch.Generator().manual_seed(1)
    windows = torch.randn(5, num_assets, spec["lookback"] * len(spec["feature_names"]), generator=generator)
    weights = torch.softmax(torch.randn(5, num_assets + 1, generator=generator), dim=-1)
    target = namespace["target_weights"](params, windows, weights)
    torch.testing.assert_close(target[:, 1:], torch.full((5, num_assets), 1 / num_assets), atol=1e-6, rtol=0)
    assert (target[:, 0] < 1e-6).all()


@pytest.mark.parametrize(
    "settings",
    [
        {"env.book": "long_short"},
        {"env.book": "long_short", "env.gross_leverage": 1.5, "env.net_exposure": "-0.2,0.4", "env.max_weight": 0.25},
        {"env.max_weight": 0.3},
    ],
)
def test_the_readme_code_makes_the_books_weights_from_the_logits(exported, settings):
    """The exported ``target_weights`` turns logits into the weights of the run's book as the trainer does
    (``Book.weights``, then the limits a fill restores)."""
    from config import override, preset
    from environment.book import Book

    config = override(preset("smoke"), settings)
    book = Book.from_env(config.env)
    namespace = readme_namespace(exported)
    logits = 3 * torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    logits[:4, 2] = -math.inf  # an asset without a price
    namespace["actor_logits"] = lambda *_: logits
    got = namespace["target_weights"](None, None, None, None, export.book_spec(config))
    torch.testing.assert_close(got, book.limit(book.weights(logits)), atol=1e-6, rtol=0)
    spec = json.loads((exported / "actor.json").read_text())
    assert spec["book"]["kind"] == "long_only" and "non-negative" in spec["observation"]["weights"]["layout"]
    short = export.observation_spec(3, 6, 1, long_short=True)["weights"]["layout"]
    assert "signed" in short and "non-negative" not in short
    assert "softmax" not in export.action_spec(3, 1, long_short=True)["meaning"]
