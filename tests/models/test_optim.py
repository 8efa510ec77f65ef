"""BatchedAdam is torch.optim.Adam over stacked parameters, with storage allocated once."""

from __future__ import annotations

import pytest
import torch

from models.optim import BatchedAdam
from tests.training.test_host_sync import SyncWatch

P, STEPS, LR = 3, 5, 1e-2
SHAPES = [(P, 4, 5), (P, 1, 5)]  # a stacked weight and bias


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]


def _grads(seed: int) -> list[list[torch.Tensor]]:
    """Random gradients for every step, varying in scale so the moments matter."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=g) * 10.0**step for shape in SHAPES] for step in range(-2, STEPS - 2)]


@pytest.mark.parametrize("foreach", [False, None, True], ids=["foreach_false", "default", "foreach_true"])
def test_matches_torch_adam(foreach):
    ours, theirs, initial = _params(), _params(), _params()
    batched = BatchedAdam(ours, lr=LR, betas=(0.8, 0.99), eps=1e-6)
    reference = torch.optim.Adam(theirs, lr=LR, betas=(0.8, 0.99), eps=1e-6, foreach=foreach)
    for grads in _grads(seed=1):
        batched.zero_grad()
        for p, g in zip(ours, grads):
            p.grad.copy_(g)
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        batched.step()
        reference.step()
    assert int(batched.step_count) == STEPS
    for mine, ref, start in zip(ours, theirs, initial):
        assert not torch.equal(mine, start)  # the comparison is not between two untouched tensors
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)
    for index, ref in enumerate(theirs):
        state = reference.state[ref]
        torch.testing.assert_close(batched.exp_avg[index], state["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(batched.exp_avg_sq[index], state["exp_avg_sq"], rtol=0, atol=0)


def test_state_allocated_once():
    params = _params()
    optim = BatchedAdam(params, lr=LR)
    # Moments and gradients exist before the first step, shaped like the parameters, at zero.
    assert len(optim.exp_avg) == len(optim.exp_avg_sq) == len(params)
    for p, m, v in zip(params, optim.exp_avg, optim.exp_avg_sq):
        assert m.shape == v.shape == p.grad.shape == p.shape
        assert not m.any() and not v.any()
    pointers = [t.data_ptr() for t in [*optim.exp_avg, *optim.exp_avg_sq, *(p.grad for p in params), *params]]
    for grads in _grads(seed=2):
        optim.zero_grad()
        for p, g in zip(params, grads):
            p.grad.copy_(g)
        optim.step()
        assert [t.data_ptr() for t in [*optim.exp_avg, *optim.exp_avg_sq, *(p.grad for p in params), *params]] == (
            pointers
        )
    assert all(m.any() for m in optim.exp_avg)  # the step wrote into that storage
    names = ["w", "b"]
    tensors = optim.state_tensors(names)
    assert set(tensors) == {"exp_avg.w", "exp_avg.b", "exp_avg_sq.w", "exp_avg_sq.b"}
    assert tensors["exp_avg.w"] is optim.exp_avg[0]
    assert tensors["exp_avg_sq.b"] is optim.exp_avg_sq[1]


def test_one_agents_gradient_does_not_reach_another():
    base, changed = _params(), _params()
    optims = BatchedAdam(base, lr=LR), BatchedAdam(changed, lr=LR)
    for grads in _grads(seed=3):
        for optim, params, bump in ((optims[0], base, 0.0), (optims[1], changed, 5.0)):
            optim.zero_grad()
            for p, g in zip(params, grads):
                p.grad.copy_(g)
                p.grad[1] += bump  # only agent 1's gradient differs
            optim.step()
    for a, b in zip(base, changed):
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
        assert not torch.equal(a[1], b[1])
    for a, b in zip(optims[0].exp_avg_sq, optims[1].exp_avg_sq):
        assert torch.equal(a[[0, 2]], b[[0, 2]])
        assert not torch.equal(a[1], b[1])


def test_why_not_torch_adam_its_step_counters_are_read_on_the_host():
    """The reason models/optim.py gives for keeping BatchedAdam, checked: torch's foreach Adam with its state made up
    front keeps its storage and matches BatchedAdam, but reads its step counters on the host every step. If a torch
    release stops reading them, this fails, and the switch is worth another look."""
    ours, theirs = _params(), _params()
    batched = BatchedAdam(ours, lr=LR)
    reference = torch.optim.Adam(theirs, lr=LR, foreach=True)
    for p in theirs:
        p.grad = torch.zeros_like(p)
        reference.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p)}
        reference.state[p]["exp_avg_sq"] = torch.zeros_like(p)
    state = [t.data_ptr() for p in theirs for t in (p, p.grad, *reference.state[p].values())]
    for grads in _grads(seed=4):
        batched.zero_grad()
        reference.zero_grad(set_to_none=False)
        for p, q, g in zip(ours, theirs, grads):
            p.grad.copy_(g)
            q.grad.copy_(g)
        batched.step()
        with SyncWatch() as watch:
            reference.step()
        assert watch.calls["aten._local_scalar_dense.default"] > 0  # on torch 2.13 each step tensor's .item(), twice
    assert [t.data_ptr() for p in theirs for t in (p, p.grad, *reference.state[p].values())] == state
    assert all(torch.equal(mine, ref) for mine, ref in zip(ours, theirs))


def test_a_step_scale_of_zero_keeps_an_agent_and_of_one_changes_nothing():
    """``evolution.frozen_elites``: a scale of 0 leaves that agent's parameters exactly as they were, while the others
    take the very step an unscaled Adam takes."""
    plain, scaled, initial = _params(), _params(), _params()
    adam, frozen_first = BatchedAdam(plain, lr=LR), BatchedAdam(scaled, lr=LR)
    scale = torch.tensor([0.0, 1.0, 1.0])
    for grads in _grads(seed=2):
        for optim, params in ((adam, plain), (frozen_first, scaled)):
            optim.zero_grad()
            for p, g in zip(params, grads):
                p.grad.copy_(g)
        adam.step()
        frozen_first.step(scale)
    for mine, theirs, start in zip(scaled, plain, initial):
        assert torch.equal(mine[0], start[0])
        assert torch.equal(mine[1:], theirs[1:])
        assert not torch.equal(theirs[0], start[0])
