"""Where results cross from the training device to the host.

Every step of a generation runs on the training device: the rollouts, validation, evolution's copies and the learner's
updates. The selection gate's bootstrap runs there too, on the validation returns where validation left them. The
decisions (the gate's critical values against each candidate, crowning, the evolution plan) and the record are taken on
the host, in float64, from CPU tensors. Device results reach the host through ``to_host`` only, at two points of a
generation: the evidence the decisions need (the gate's critical values, then fitness and validation returns,
``Trainer._validate``) and the update's losses (``Trainer._update``); once at start, the validation days' price
relatives for the gate's block length.
The checkpoint's copies go through their own pinned staging buffers (``persistence.staging``).

Host code never reads a device tensor as Python values (``.item()``, ``float()``, ``.tolist()``, ``.numpy()``): on a
GPU each read waits for the device, and ``.numpy()`` fails outright. The CPU tests run the CUDA path on an emulated
device that fails on every such read, on host tensors mixed into device arithmetic and on host generators drawing on
the device (``tests/emulated_cuda.py``).
"""

from __future__ import annotations

import torch


def to_host(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` on the host (in ``dtype`` when given; a copy unless it is there already), detached: the one way
    device results come over."""
    return tensor.detach().to("cpu", dtype=dtype)
