"""Staging a checkpoint: copies of its tensors in host buffers allocated once, so the loop can go on.

A generation's checkpoint is hundreds of megabytes at the ``paper`` preset. Serialising, hashing, writing and
fsyncing that inline leaves the accelerator idle, so the loop only copies the tensors into staging buffers (pinned on
CUDA) and hands the rest to the writer thread (``persistence.writer``). Training of the next generation then changes
the live tensors, never the staged copies, so the files hold the generation exactly as it was when it was staged, and
bit-exact resume is unchanged.
"""

from __future__ import annotations

import torch


class StagingBuffers:
    """Host copies of a checkpoint's tensors, allocated at the first ``capture`` with the full shape of each source
    and reused by every later one.

    On CUDA they are pinned, so the device-to-host copies run asynchronously and the loop waits for them once.

    Args:
        device: the training device the sources live on.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self._buffers: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of staging memory allocated so far."""
        return sum(t.numel() * t.element_size() for group in self._buffers.values() for t in group.values())

    @torch.no_grad()
    def capture(
        self, groups: dict[str, dict[str, torch.Tensor]], *, rows: dict[str, int] | None = None
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Copy every tensor of ``groups`` into its staging buffer; returns the staged copies, complete.

        Args:
            groups: group name -> key -> source tensor; the same names, shapes and dtypes at every call.
            rows: for a group named here, only the first ``rows[group]`` rows of each tensor are copied and
                returned (the filled part of the replay buffer, whose tensors have its full capacity).

        The staged copies stay valid until the next ``capture``.
        """
        rows = rows or {}
        staged: dict[str, dict[str, torch.Tensor]] = {}
        for name, group in groups.items():
            buffers = self._buffers.setdefault(name, {})
            count = rows.get(name)
            staged[name] = {}
            for key, source in group.items():
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=self.pinned)
                    buffers[key] = buffer
                elif buffer.shape != source.shape or buffer.dtype != source.dtype:
                    raise ValueError(
                        f"{name}.{key} is {source.dtype} {tuple(source.shape)}, its staging buffer "
                        f"{buffer.dtype} {tuple(buffer.shape)}: checkpointed tensors must keep their shapes"
                    )
                if count is not None:
                    buffer, source = buffer[:count], source[:count]
                buffer.copy_(source, non_blocking=self.pinned)
                staged[name][key] = buffer
        if self.pinned:  # the one wait: every copy above was queued on this stream
            torch.cuda.current_stream(self.device).synchronize()
        return staged
