"""Adam over stacked population parameters, with its state allocated up front.

Adam is elementwise, so one Adam over (P, ...) parameters is P independent Adams. This one differs
from ``torch.optim.Adam`` only in bookkeeping: its moments exist from construction (allocate once),
are plain tensors that evolution can index and copy per agent, and checkpoint as safetensors.
Every agent takes the same number of steps, so one step counter serves them all; it lives on the device, so that a
step replayed from a CUDA graph counts. The arithmetic is ``torch.optim.Adam``'s (no weight decay, no amsgrad); a
test pins the two together to the last bit.

Not ``torch.optim.Adam`` with pre-created state: it reads each parameter's step counter on the host at every step,
which ``tests/training/test_host_sync.py`` forbids inside a phase (MEMORY.md, "Why a batched Adam of our own").
"""

from __future__ import annotations

import torch


class BatchedAdam:
    def __init__(
        self,
        params: list[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = list(params)
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        device = self.params[0].device
        # Steps taken, counted on the device: a step captured in a CUDA graph (training.graphs) reads its bias
        # corrections from here on every replay, where a Python count would stay what it was at the capture.
        self.step_count = torch.zeros((), dtype=torch.float64, device=device)
        self._half = torch.tensor(0.5, dtype=torch.float64, device=device)  # a square root as Python's ** 0.5 takes it
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        for p in self.params:  # gradients live as long as the parameters, zeroed between steps
            p.grad = torch.zeros_like(p)

    def zero_grad(self) -> None:
        torch._foreach_zero_([p.grad for p in self.params])

    @torch.no_grad()
    def step(self, scale: torch.Tensor | None = None) -> None:
        """One Adam step of every agent; ``scale`` (P,) of 0 or 1 per agent: 0 leaves that agent as it is (its moments
        still see the gradient), 1 takes the step an unscaled call takes, bit for bit.

        The bias corrections are float64 tensors computed as torch.optim.Adam computes its Python floats, and the
        update ``p + (m * step_size) / denom`` rounds as its ``addcdiv`` does: the same numbers to the last bit.
        """
        grads = [p.grad for p in self.params]
        self.step_count += 1
        torch._foreach_lerp_(self.exp_avg, grads, 1 - self.beta1)
        torch._foreach_mul_(self.exp_avg_sq, self.beta2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1 - self.beta2)
        bias_correction1 = 1 - torch.pow(self.beta1, self.step_count)
        bias_correction2_sqrt = torch.pow(1 - torch.pow(self.beta2, self.step_count), self._half)
        step_size = (-self.lr / bias_correction1).float()
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2_sqrt.float())
        torch._foreach_add_(denom, self.eps)
        if scale is not None:  # through the denominator: 1 leaves the arithmetic as it is, 0 makes the step 0 exactly
            for d in denom:
                d.div_(scale.view(-1, *([1] * (d.dim() - 1))))
        updates = torch._foreach_mul(self.exp_avg, step_size)
        torch._foreach_div_(updates, denom)
        torch._foreach_add_(self.params, updates)

    def state_tensors(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Moments keyed ``exp_avg.<name>`` / ``exp_avg_sq.<name>`` for the parameters' names."""
        out = {f"exp_avg.{n}": t for n, t in zip(names, self.exp_avg)}
        out.update({f"exp_avg_sq.{n}": t for n, t in zip(names, self.exp_avg_sq)})
        return out
