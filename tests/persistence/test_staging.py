"""Staging a checkpoint: copies taken once per generation into host buffers allocated once (pinned on CUDA), complete
when the capture returns."""

from __future__ import annotations

import pytest
import torch

from persistence.staging import StagingBuffers


def test_staged_copies_keep_the_sources_as_they_were_in_buffers_allocated_once():
    ring = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    weights = torch.randn(3, 4)
    staging = StagingBuffers(torch.device("cpu"))
    staged = staging.capture({"population": {"w": weights}, "replay": {"ring": ring}}, rows={"replay": 2})
    assert torch.equal(staged["population"]["w"], weights)
    assert torch.equal(staged["replay"]["ring"], ring[:2])  # the filled part only
    pointers = (staged["population"]["w"].data_ptr(), staged["replay"]["ring"].data_ptr())
    expected = weights.clone()
    weights.add_(1.0)  # training goes on with the live tensors
    assert torch.equal(staged["population"]["w"], expected)

    again = staging.capture({"population": {"w": weights}, "replay": {"ring": ring}}, rows={"replay": 6})
    assert (again["population"]["w"].data_ptr(), again["replay"]["ring"].data_ptr()) == pointers
    assert torch.equal(again["population"]["w"], weights) and torch.equal(again["replay"]["ring"], ring)
    assert staging.nbytes == weights.nbytes + ring.nbytes
    with pytest.raises(ValueError, match="must keep their shapes"):
        staging.capture({"population": {"w": torch.zeros(2, 4)}})


def test_staging_from_cuda_is_pinned_and_complete_when_capture_returns(cuda):
    source = torch.randn(1024, 1024, device="cuda", generator=torch.Generator(device="cuda"))
    staging = StagingBuffers(source.device)
    staged = staging.capture({"group": {"t": source}})["group"]["t"]
    assert staged.is_pinned() and staged.device.type == "cpu"
    assert torch.equal(staged, source.cpu())
