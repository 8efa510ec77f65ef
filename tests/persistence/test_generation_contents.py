"""The state document: built from the one list of keys the reader checks, and refused key by key when wrong."""

from __future__ import annotations

import pytest

from persistence import checkpoint
from persistence.generation_contents import (
    OPTIONAL_TYPES,
    STATE_TYPES,
    build_state,
    history_problem,
    state_problem,
    upgraded,
)


def a_state(**changes):
    values = {
        "generation": 3,
        "champion_score": None,
        "champion_generation": 0,
        "champion_bound": 0.0,
        "optimiser_steps": {"actor": 12, "critic": 12},
        "market_fingerprint": "ab",
        "tickers": ["A", "B"],
        "splits": {"train": ["2020-01-02", "2020-12-31"]},
        "config": {},
        "device": {"type": "cpu"},
    }
    return build_state(**{**values, **changes})


def test_a_built_document_holds_exactly_the_checked_keys_in_order_and_passes():
    state = a_state()
    assert list(state) == [*STATE_TYPES, *OPTIONAL_TYPES]
    assert state["format_version"] == checkpoint.FORMAT_VERSION
    assert state_problem(state, 3) is None


def test_a_document_of_an_earlier_version_with_keys_nothing_reads_still_passes():
    state = {**a_state(), "replay_pos": 5, "replay_size": 5}
    assert state_problem(state, 3) is None


def test_a_writer_out_of_step_with_the_reader_fails_at_the_build():
    with pytest.raises(ValueError, match="missing"):
        build_state(generation=1)
    with pytest.raises(ValueError, match="unknown"):
        a_state(extra=1)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"generation": "3"}, "'generation' is '3'"),
        ({"champion_generation": 4}, "after generation 3"),
        ({"optimiser_steps": {"actor": -1}}, "gives 'actor' -1, not a count"),
        ({"tickers": ["A", 1]}, "not a string"),
        ({"device": "cpu"}, "'device' is"),
        ({"optimiser_steps": {"critic": True}}, "gives 'critic' True, not a count"),
        ({"optimiser_steps": [12, 12]}, "'optimiser_steps' is [12, 12]"),
    ],
)
def test_a_wrong_value_is_named(changes, problem):
    state = {**a_state(), **changes}
    assert problem in state_problem(state, 3)


def test_step_counts_written_one_key_each_by_earlier_versions_read_by_the_optimisers_names():
    earlier = {k: v for k, v in a_state().items() if k != "optimiser_steps"}
    earlier.update(actor_optim_steps=12, critic_optim_steps=6)
    assert state_problem(earlier, 3) is None
    assert upgraded(earlier)["optimiser_steps"] == {"actor": 12, "critic": 6}
    assert "actor_optim_steps" not in upgraded(earlier)


def test_a_history_must_be_rows_with_generations():
    assert history_problem([{"generation": 1}]) is None
    assert "not a list" in history_problem({})
    assert "integer 'generation'" in history_problem([{"generation": "1"}])
