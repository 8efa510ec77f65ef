"""Adam over stacked population parameters, with its state allocated up front.

Adam is elementwise, so one Adam over (P, ...) parameters is P independent Adams. This one differs
from ``torch.optim.Adam`` only in bookkeeping: its moments exist from construction (allocate once),
are plain tensors that evolution can index and copy per agent, and checkpoint as safetensors.
Every agent takes the same number of steps, so one step counter serves them all; it lives on the device, so that a
step replayed from a CUDA graph counts. The arithmetic is ``torch.optim.Adam``'s (no weight decay, no amsgrad); a
test pins the two together to the last bit.

Two things are per agent, because agents are independent: the gradient-norm clip before each step (the norm of one
agent's gradients, not of all of them), and, when asked for, a learning-rate scale (``lr_scale``, (P,)), which a
caller sets to 0 for the agents that must keep their parameters this step (their moments still see the gradient).

Not ``torch.optim.Adam`` with pre-created state: it reads each parameter's step counter on the host at every step,
which ``tests/training/test_host_sync.py`` forbids inside a phase (MEMORY.md, "Why a batched Adam of our own").
"""

from __future__ import annotations

import torch


class BatchedAdam:
    """Adam over parameters whose dim 0 is the agent.

    Args:
        params: the stacked parameters, each (P, ...); their gradients are allocated here, once.
        lr: the learning rate.
        betas, eps: Adam's.
        max_grad_norm: each agent's gradients are scaled before a step so that their joint L2 norm is at most this;
            0 disables the clip.
        per_agent_lr: allocate ``lr_scale`` (P,), ones, which multiplies each agent's step.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        max_grad_norm: float = 0.0,
        per_agent_lr: bool = False,
    ) -> None:
        self.params = list(params)
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.max_grad_norm = max_grad_norm
        device = self.params[0].device
        # Steps taken, counted on the device: a step captured in a CUDA graph (runtime.graphs) reads its bias
        # corrections from here on every replay, where a Python count would stay what it was at the capture.
        self.step_count = torch.zeros((), dtype=torch.float64, device=device)
        self._half = torch.tensor(0.5, dtype=torch.float64, device=device)  # a square root as Python's ** 0.5 takes it
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        agents = self.params[0].shape[0]
        self.lr_scale = torch.ones(agents, device=device) if per_agent_lr else None
        """(P,) multiplies each agent's step (1: the plain step bit for bit, 0: no step); None unless asked for."""
        for p in self.params:  # gradients live as long as the parameters, zeroed between steps
            p.grad = torch.zeros_like(p)

    def zero_grad(self) -> None:
        torch._foreach_zero_([p.grad for p in self.params])

    @torch.no_grad()
    def step(self) -> None:
        """Clip each agent's gradients to ``max_grad_norm``, then one Adam step of every agent, scaled by ``lr_scale``.

        The bias corrections are float64 tensors computed as torch.optim.Adam computes its Python floats, and the
        update ``p + (m * step_size) / denom`` rounds as its ``addcdiv`` does: the same numbers to the last bit.
        """
        grads = [p.grad for p in self.params]
        if self.max_grad_norm > 0:
            clip_grad_norm_per_agent_(grads, self.max_grad_norm)
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
        updates = torch._foreach_mul(self.exp_avg, step_size)
        torch._foreach_div_(updates, denom)
        if self.lr_scale is not None:  # 1 leaves a step as it is, 0 makes it 0 exactly
            for update in updates:
                update.mul_(self.lr_scale.view(-1, *([1] * (update.dim() - 1))))
        torch._foreach_add_(self.params, updates)

    def state_tensors(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Moments keyed ``exp_avg.<name>`` / ``exp_avg_sq.<name>`` for the parameters' names."""
        out = {f"exp_avg.{n}": t for n, t in zip(names, self.exp_avg)}
        out.update({f"exp_avg_sq.{n}": t for n, t in zip(names, self.exp_avg_sq)})
        return out


@torch.no_grad()
def clip_grad_norm_per_agent_(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale each agent's gradients (dim 0) so that their joint L2 norm is at most ``max_norm``; returns (P,) norms.

    0 disables clipping. No host synchronisation: the scale is computed and applied on the device.
    """
    squares = torch.stack([g.pow(2).flatten(1).sum(dim=1) for g in grads])  # (num_params, P)
    norms = squares.sum(dim=0).sqrt()  # (P,)
    if max_norm > 0:
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
    return norms
