"""A generation's console line says what the figures are: the best agent's edge over equal weight and the edge that
would prove it, or the champion's edge and its bound; the tensor count when it was counted."""

from __future__ import annotations

from training.records import format_line

ROW = {
    "generation": 3,
    "best_fitness": 0.1,
    "mean_fitness": 0.0,
    "worst_fitness": -0.1,
    "champion_score": 0.2,
    "champion_generation": 0,
    "champion_edge": 0.0,
    "champion_bound": 0.0,
    "best_edge": 0.028,
    "best_edge_needed": 0.159,
    "buffer_size": 10,
    "env_steps_per_s": 1e4,
    "generation_s": 0.5,
    "rss_bytes": 5e8,
    "live_tensors": 432,
}


def test_before_a_crowning_the_line_shows_the_best_edge_and_what_would_prove_it():
    line = format_line(ROW, generations=5, buffer_capacity=100)
    assert "(equal weight; best agent's edge +2.8%/y, proven above +15.9%/y)" in line


def test_a_crowned_champion_shows_its_edge_and_its_bound():
    crowned = {**ROW, "champion_generation": 2, "champion_edge": 0.061, "champion_bound": 0.012}
    assert "(gen 2; edge +6.1%/y, bound +1.2%/y)" in format_line(crowned, generations=5, buffer_capacity=100)


def test_the_tensor_count_is_shown_only_when_it_was_counted():
    assert format_line(ROW, generations=5, buffer_capacity=100).endswith("| 432 tensors")
    assert "tensors" not in format_line({**ROW, "live_tensors": None}, generations=5, buffer_capacity=100)
