import dataclasses
import json
import re

import pytest

import config
from config import Config, coerce_setting, conventions, describe_conventions, override, parse_assignments, preset
from utils.errors import ConfigError


def test_every_field_has_a_one_line_doc():
    docs = config.field_docs()
    for section in dataclasses.fields(Config):
        for field in dataclasses.fields(getattr(Config(), section.name)):
            key = f"{section.name}.{field.name}"
            assert docs.get(key), f"{key} has no docstring"
            assert "\n" not in docs[key]


@pytest.mark.parametrize("name", ["smoke", "default", "paper"])
def test_presets_are_valid_and_round_trip_through_json(name):
    cfg = preset(name)
    assert Config.from_dict(json.loads(cfg.to_json())) == cfg


def test_presets_have_the_promised_scale():
    smoke, paper = preset("smoke"), preset("paper")
    assert smoke.runtime.generations == 3
    assert paper.evolution.popsize >= 16
    assert paper.env.lookback == preset("default").env.lookback == 1  # longer windows memorise (RESULTS.md)
    assert paper.learner.buffer_size == 1_000_000
    assert paper.data.tickers == ()  # every asset of the data set
    assert paper.checkpoint.every == 2 and smoke.checkpoint.every == preset("default").checkpoint.every == 1


@pytest.mark.parametrize("name", ["smoke", "default", "paper"])
def test_presets_work_with_any_data_file(name):
    # Which tickers and dates to trade is the user's choice; a preset only sets sizes.
    data = preset(name).data
    assert (data.tickers, data.start, data.end) == ((), "", "")


def test_override_converts_strings_to_the_field_types():
    cfg = override(
        Config(),
        parse_assignments(
            [
                "learner.tau=0.01",
                "evolution.popsize=8",
                "runtime.progress=false",
                "data.tickers=AAPL, KO",
                "evolution.fitness=sharpe",
            ]
        ),
    )
    assert cfg.learner.tau == 0.01
    assert cfg.evolution.popsize == 8
    assert cfg.runtime.progress is False
    assert cfg.data.tickers == ("AAPL", "KO")
    assert cfg.evolution.fitness == "sharpe"
    assert Config().learner.tau == 0.005  # the original is untouched (frozen)


@pytest.mark.parametrize(
    ("key", "value", "phrase"),
    [
        ("learner.tauu", "0.1", "unknown config key 'learner.tauu'"),
        ("ddpg", "0.1", "unknown config key 'ddpg'"),
        ("learner.tau", "abc", "config key learner.tau expects float"),
        ("learner.tau", "nan", "config key learner.tau expects float"),
        ("evolution.popsize", "1.5", "expects int"),
        ("runtime.progress", "maybe", "expects bool"),
        ("evolution.fitness", "best", "one of mean_log_return|sharpe|worst_k"),
        ("learner.tau", "0", "learner.tau"),
        ("learner.observation_noise", "-0.5", "learner.observation_noise"),
        ("evolution.elites", "16", "evolution.elites"),
        ("data.start", "2020-13-01", "data.start"),
        ("selection.method", "last", "one of bootstrap|final|bonferroni"),
        ("selection.early_fraction", "1.5", "selection.early_fraction"),
        ("selection.min_edge", "-0.01", "selection.min_edge"),
        ("checkpoint.every", "0", "checkpoint.every must be >= 1"),
    ],
)
def test_bad_overrides_name_the_key(key, value, phrase):
    with pytest.raises(ConfigError) as error:
        override(Config(), {key: value})
    assert phrase in str(error.value)
    assert "\n" not in str(error.value)


def test_validation_needs_two_days_for_the_selection_test():
    with pytest.raises(ConfigError, match=r"data\.validation_days.*>= 2"):
        override(Config(), {"data.validation_days": "1"})
    # Validation is one continuous episode of its own length, so it need not hold a training episode.
    assert override(Config(), {"data.validation_days": "10", "env.episode_days": "20"}).data.validation_days == 10


def test_from_dict_rejects_unknown_keys():
    values = Config().to_dict()
    values["learner"]["mystery"] = 1
    with pytest.raises(ConfigError, match=r"learner\.mystery"):
        Config.from_dict(values)


def test_a_config_written_before_the_rollout_section_was_renamed_still_loads():
    """Checkpoints of earlier versions call the rollout section ``evaluation``: a resume must read them as before."""
    written = Config().to_dict()
    written["evaluation"] = {**written.pop("rollout"), "episodes": 12}
    loaded = Config.from_dict(written)
    assert loaded.rollout.episodes == 12
    assert loaded == override(Config(), {"rollout.episodes": 12})
    with pytest.raises(ConfigError, match="evaluation"):
        override(Config(), {"evaluation.episodes": 12})  # on the command line only the new name


def test_a_config_written_when_the_learner_was_called_ddpg_still_loads_and_the_old_name_points_to_the_new():
    written = Config().to_dict()
    written["ddpg"] = {**written.pop("learner"), "gamma": 0.9}
    assert Config.from_dict(written) == override(Config(), {"learner.gamma": 0.9})
    with pytest.raises(ConfigError, match=r"ddpg is now called learner: learner\.gamma"):
        override(Config(), parse_assignments(["ddpg.gamma=0.9"]))


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("runtime.census_share", "runtime.census_fraction", 0.5),
        ("selection.early_share", "selection.early_fraction", 0.3),
    ],
)
def test_a_config_written_with_a_keys_old_name_still_loads_and_the_old_name_points_to_the_new(old, new, value):
    """ "Share" names the agents a process holds; the fractions that were called shares load under their new names."""
    section, _, old_name = old.partition(".")
    written = Config().to_dict()
    written[section] = {k: v for k, v in written[section].items() if k != new.partition(".")[2]}
    written[section][old_name] = value
    assert Config.from_dict(written) == override(Config(), {new: value})
    for set_it in (
        lambda: override(Config(), parse_assignments([f"{old}={value}"])),
        lambda: coerce_setting(old, value),
    ):
        with pytest.raises(ConfigError, match=rf"{old} is now called {new}$"):
            set_it()


def test_a_config_naming_a_removed_key_still_loads_and_the_key_is_refused_with_why():
    written = Config().to_dict()
    written["runtime"]["compile"] = True  # runtime.compile, removed
    assert Config.from_dict(written) == Config()
    for set_it in (
        lambda: override(Config(), {"runtime.compile": "true"}),
        lambda: coerce_setting("runtime.compile", 1),
    ):
        with pytest.raises(ConfigError, match=r"runtime.compile was removed: .*crashed on a GPU"):
            set_it()


def test_a_config_written_before_fills_could_wait_loads_as_it_ran():
    """Earlier versions filled at the close a decision observed and kept only the dates all tickers share: their
    config documents lack the keys, and load with what those versions did, so that they resume as they ran."""
    written = Config().to_dict()
    del written["env"]["execution_delay"], written["data"]["universe"]
    loaded = Config.from_dict(written)
    assert loaded.env.execution_delay == 0 and loaded.data.universe == "common"
    assert Config().env.execution_delay == 1 and Config().data.universe == "point_in_time"  # new runs
    assert Config.from_dict(Config().to_dict()) == Config()  # a present key is read as written


def test_a_config_written_before_checkpoints_could_skip_generations_loads_as_it_ran():
    written = Config().to_dict()
    del written["checkpoint"]["every"]
    assert Config.from_dict(written).checkpoint.every == 1  # a checkpoint every generation, as then


def test_the_trading_settings_are_checked_in_one_line():
    for key, value, phrase in (
        ("env.execution_delay", "-1", "must be in [0, 20]"),
        ("env.cash_rate", "5", "0.05 is 5%"),
        ("data.universe", "survivors", "one of point_in_time|common"),
        ("data.features", "volume,volume", "names volume more than once"),
    ):
        with pytest.raises(ConfigError, match=re.escape(phrase)):
            override(Config(), {key: value})
    with pytest.raises(ConfigError, match=r"data\.risk_free and env\.cash_rate both set what cash earns"):
        override(Config(), {"data.risk_free": "rates.csv", "env.cash_rate": "0.02"})


def test_the_conventions_a_run_states():
    config = override(Config(), {"env.execution_delay": "0", "env.cash_rate": "0.03", "data.features": "builtin,vol"})
    stated = conventions(config)
    assert stated == {
        "execution_delay": 0,
        "universe": "point_in_time",
        "features": ["builtin", "vol"],
        "cash": 0.03,
        "benchmark": "bundled",
        "delisting_return": 0.0,
        "book": "long-only, rebalanced daily, trades sized at 1,000,000 against a volume column where the file has one",
    }
    line = describe_conventions(stated)
    assert "at the close it observed" in line and "optimistic" in line and "cash earns 3%/y" in line
    assert "fills 1 trading day after the decision" in describe_conventions(conventions(Config()))
    # What a delisting pays where the file says nothing is stated with a point-in-time universe, and only there.
    assert "| a delisting pays 0% where the file gives no return | long-only, rebalanced daily" in line
    lost = conventions(override(Config(), {"data.delisting_return": "-0.3"}))
    assert "| a delisting pays -30% where the file gives no return |" in describe_conventions(lost)
    # The book: its kind, limits, holding costs and cadence.
    short = conventions(override(Config(), {"env.book": "long_short", "env.rebalance_every": "5"}))["book"]
    assert short.startswith("long-short: gross <= 2, net in [-1, 1], at most 0.5 an asset, borrow 0.5%/y")
    assert "rebalanced every 5 trading days" in short
    assert "delisting" not in describe_conventions(conventions(override(Config(), {"data.universe": "common"})))
    earlier = {key: value for key, value in stated.items() if key != "delisting_return"}  # a run of an earlier version
    assert "delisting" not in describe_conventions(earlier)
