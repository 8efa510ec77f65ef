"""The agents held here (``models.share``): draws made for the whole population, each share keeping its rows."""

from __future__ import annotations

import pytest
import torch

from models.share import Share


def test_a_share_keeps_its_rows_of_a_draw_for_the_whole_population():
    whole = Share.whole(6)
    assert whole.agents == 6 and whole.slots == range(6)
    full = whole.draw(torch.randn, 3, 2, generator=torch.Generator().manual_seed(5))
    parts = [Share(6, range(start, start + 2)) for start in (0, 2, 4)]
    drawn = [part.draw(torch.randn, 3, 2, generator=torch.Generator().manual_seed(5)) for part in parts]
    assert [d.shape for d in drawn] == [torch.Size([2, 3, 2])] * 3
    assert torch.equal(torch.cat(drawn), full)  # however the population is split, an agent draws the same numbers


def test_mine_is_a_view_of_the_rows_held_here():
    tensor = torch.arange(12.0).view(6, 2)
    share = Share(6, range(4, 6))
    view = share.mine(tensor)
    assert torch.equal(view, tensor[4:6])
    view.zero_()
    assert tensor[4:].eq(0).all() and tensor[:4].ne(0).any()


@pytest.mark.parametrize("slots", [range(0, 3), range(3, 6)])
def test_a_split_population_starts_as_the_same_agents_of_the_whole(slots):
    from tests.synthetic import make_population

    whole = make_population(6, 4, seed=1, width=4).state_tensors()
    part = make_population(6, 4, seed=1, width=4, slots=slots)
    assert part.share == Share(6, slots)
    assert torch.equal(part.exploration_stdev, whole["exploration_stdev"][slots.start : slots.stop])
