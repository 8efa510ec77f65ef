"""BatchedAdam is torch.optim.Adam over stacked parameters, with storage allocated once."""

from __future__ import annotations

import pytest
import torch

from models.optim import BatchedAdam, clip_grad_norm_per_agent_
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


def test_a_learning_rate_scale_of_zero_keeps_an_agent_and_of_one_changes_nothing():
    """``evolution.frozen_elites``: a scale of 0 leaves that agent's parameters exactly as they were (its moments still
    see the gradient), while the others take the very step an unscaled Adam takes."""
    plain, scaled, initial = _params(), _params(), _params()
    adam, frozen_first = BatchedAdam(plain, lr=LR), BatchedAdam(scaled, lr=LR, per_agent_lr=True)
    assert adam.lr_scale is None and torch.equal(frozen_first.lr_scale, torch.ones(P))
    frozen_first.lr_scale.copy_(torch.tensor([0.0, 1.0, 1.0]))
    for grads in _grads(seed=2):
        for optim, params in ((adam, plain), (frozen_first, scaled)):
            optim.zero_grad()
            for p, g in zip(params, grads):
                p.grad.copy_(g)
        adam.step()
        frozen_first.step()
    for mine, theirs, start in zip(scaled, plain, initial):
        assert torch.equal(mine[0], start[0])
        assert torch.equal(mine[1:], theirs[1:])
        assert not torch.equal(theirs[0], start[0])
    for mine, theirs in zip(frozen_first.exp_avg_sq, adam.exp_avg_sq):
        assert torch.equal(mine, theirs)


def _clip_grads(norms: list[float], seed: int = 0) -> list[torch.Tensor]:
    """Two stacked gradients whose joint L2 norm is ``norms[i]`` for agent i."""
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(len(norms), 3, 4, generator=g), torch.randn(len(norms), 5, generator=g)]
    current = torch.stack([gr.flatten(1).pow(2).sum(1) for gr in grads]).sum(0).sqrt()
    return [gr * (torch.tensor(norms) / current).view(-1, *[1] * (gr.dim() - 1)) for gr in grads]


def test_gradient_norm_is_clipped_per_agent():
    grads = _clip_grads([0.4, 7.0, 2.5])
    before = [g.clone() for g in grads]
    returned = clip_grad_norm_per_agent_(grads, 1.0)
    torch.testing.assert_close(returned, torch.tensor([0.4, 7.0, 2.5]))
    for g, old in zip(grads, before):
        assert torch.equal(g[0], old[0])  # under the limit: untouched, bit for bit
        torch.testing.assert_close(g[1], old[1] / 7.0, rtol=1e-5, atol=1e-7)  # above it: scaled, direction kept
    norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
    torch.testing.assert_close(norms, torch.tensor([0.4, 1.0, 1.0]), rtol=1e-5, atol=1e-5)


def test_a_step_clips_each_agents_gradients_first_and_max_norm_zero_does_not():
    """The step clips before Adam: it takes the step of the gradients clipped by hand; with max_grad_norm 0 the
    gradients are used as they are (agent 1's norm is 10, so the two differ)."""
    grads = _clip_grads([0.5, 10.0], seed=3)
    hand = [g.clone() for g in grads]
    clip_grad_norm_per_agent_(hand, 1.0)
    params = [[torch.nn.Parameter(torch.zeros_like(g)) for g in grads] for _ in range(3)]
    optims = [BatchedAdam(params[0], lr=LR, max_grad_norm=1.0), BatchedAdam(params[1], lr=LR)]
    optims.append(BatchedAdam(params[2], lr=LR))
    for optim, group, source in zip(optims, params, (grads, hand, grads)):
        for p, g in zip(group, source):
            p.grad.copy_(g)
        optim.step()
    assert all(torch.equal(a, b) for a, b in zip(params[0], params[1]))
    assert not all(torch.equal(a, b) for a, b in zip(params[0], params[2]))
