"""Actor and critic for a whole population at once: every parameter has a leading dimension P.

A population network is one ``nn.Module`` whose layers hold (P, in, out) weights and run as batched
matmuls, so one forward evaluates every agent. Agent ``i`` is the slice ``[i]`` of every parameter.

Both networks read an observation (``environment.observation.Observation``): (N, L * K) feature
windows plus (N + 1) weights, cash first, and share one design: a per-asset encoder (the same
weights for every asset) turns each asset's window into an embedding, so the networks work for any
number of assets and see each asset the same way.

* Actor: per asset, [embedding, mean embedding over assets, the asset's weight] -> MLP -> a logit;
  cash gets a logit from [mean embedding, cash weight]. Softmax over N + 1 gives target weights. An asset without a
  price on the decision day (``Observation.tradable``) gets a logit of -inf: no weight, before the softmax.
  The policy is a tilt around equal weight: the heads' last layers start near zero, and the cash logit
  starts at ``CASH_LOGIT``, so a new agent holds close to 1/N in every asset and trades little until
  learning gives it a reason to. All-zero last layers are exactly equal weight (``set_equal_weight_``).
* Critic: per asset, [embedding, weight, action] -> MLP, averaged over assets, then with the cash
  weight and action -> MLP -> Q.

A head's first layer reads the concatenation of its inputs, but the concatenation is never written: its weight's
rows for each input multiply that input alone (``BatchedLinear.part``), so the context's product is made once per
observation, not once per asset, and the part that depends on the observation's market part alone (the encoder, the
embeddings' and the context's products) is computed apart from the part that depends on the portfolio's weights
(``Actor.features`` and ``Actor.decide``; ``Critic.features`` and ``Critic.value``). A day's decision then reruns
only the small part: the market's part of a whole block of days is computed in one pass (``training.rollout``).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from torch import nn

from config import ModelConfig
from environment.book import LONG_ONLY, Book
from environment.observation import Observation
from models.share import Share

CASH_LOGIT = -4.0
"""Initial bias of the cash logit: a new agent keeps about e^-4 / N of its value in cash."""
HEAD_INIT_SCALE = 0.1
"""The heads' last layers start at this fraction of the default scale: agents start as small tilts."""


class BatchedLinear(nn.Module):
    """P independent linear layers: (P or 1, M, in) -> (P, M, out)."""

    def __init__(self, popsize: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(popsize, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(popsize, 1, out_features))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator, *, scale: float = 1.0, share: Share | None = None) -> None:
        """Uniform(-b, b) with b = scale/sqrt(in), each agent drawn independently (nn.Linear's scale at 1).

        ``share``: this module holds only these agents of a larger population (``models.share``).
        """
        bound = scale / math.sqrt(self.weight.shape[1])
        share = share or Share.whole(self.weight.shape[0])
        for tensor in (self.weight, self.bias):
            noise = share.draw(torch.rand, *tensor.shape[1:], generator=generator, device=generator.device)
            tensor.copy_(noise.to(tensor.device).mul_(2 * bound).sub_(bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.shape[-1] == 1 and torch.compiler.is_compiling():
            # One output is a reduction over the inputs, which a compiler fuses with the kernel that made them (a
            # matmul library call would stand apart); eager keeps the matmul, and its numbers.
            return (x * self.weight.transpose(1, 2)).sum(-1, keepdim=True) + self.bias
        if x.shape[0] == self.weight.shape[0]:
            if self.weight.shape[-1] == 1 and torch.is_grad_enabled() and not _autocasting(x.device):
                return _OneOutput.apply(self.bias, x, self.weight)
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.matmul(x, self.weight) + self.bias  # x shared by all agents: (1, M, in)

    def part(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """(P, ..., stop - start) -> (P, ..., out): the product of the input rows ``start:stop`` of the weight, without
        the bias, as if ``x`` stood at those columns of the layer's input."""
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        return torch.bmm(flat, self.weight[:, start:stop]).reshape(*x.shape[:-1], self.weight.shape[-1])

    def column(self, index: int) -> torch.Tensor:
        """(P, out) the weight's row for one scalar input ``index``: what one unit of that input adds."""
        return self.weight[:, index]


class _OneOutput(torch.autograd.Function):
    """A one-output batched layer, ``baddbmm(bias, x, weight)``, whose input gradient is the product of the output's
    gradient and the weight's row, broadcast: the same numbers as the matmul autograd would launch (one product per
    element, nothing summed), without a matmul of inner size 1, which runs several times slower than the product."""

    @staticmethod
    def forward(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(bias, x, weight)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, x, weight = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        bias_grad = grad.sum(1, keepdim=True) if ctx.needs_input_grad[0] else None
        x_grad = grad * weight.transpose(1, 2) if ctx.needs_input_grad[1] else None
        weight_grad = torch.bmm(x.transpose(1, 2), grad) if ctx.needs_input_grad[2] else None
        return bias_grad, x_grad, weight_grad


def _autocasting(device: torch.device) -> bool:
    """Whether autocast is on for ``device`` (there the matmul's factors are cast, and its gradient with them)."""
    return device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type)


class BatchedMLP(nn.Module):
    """Batched linear layers with ReLU between them (none after the last)."""

    def __init__(self, popsize: int, sizes: list[int], *, final_activation: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(BatchedLinear(popsize, a, b) for a, b in itertools.pairwise(sizes))
        self.final_activation = final_activation

    def reset_parameters(
        self, generator: torch.Generator, *, last_scale: float = 1.0, share: Share | None = None
    ) -> None:
        for index, layer in enumerate(self.layers):
            layer.reset_parameters(generator, scale=last_scale if index == len(self.layers) - 1 else 1.0, share=share)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        h = x.reshape(x.shape[0], -1, x.shape[-1])  # (P or 1, M, in)
        for index, layer in enumerate(self.layers):
            h = layer(h)
            if index < len(self.layers) - 1 or self.final_activation:
                h = torch.relu_(h)  # in place: the matmul that made h does not need it for its backward
        return h.reshape(h.shape[0], *leading[1:], h.shape[-1])


class AssetEncoder(nn.Module):
    """(P or 1, M, N, L * K) windows -> (P, M, N, embedding): one MLP applied to every asset."""

    def __init__(self, popsize: int, window_size: int, model: ModelConfig) -> None:
        super().__init__()
        self.mlp = BatchedMLP(popsize, [window_size, model.encoder_hidden, model.embedding], final_activation=True)
        self.bf16 = model.bf16_encoder

    def reset_parameters(self, generator: torch.Generator, *, share: Share | None = None) -> None:
        self.mlp.reset_parameters(generator, share=share)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        if not self.bf16:
            return self.mlp(windows)
        with torch.autocast(windows.device.type, dtype=torch.bfloat16):
            return self.mlp(windows).float()  # the heads and everything after stay in float32


class ActorFeatures(NamedTuple):
    """What an actor computes from observation windows alone, before it sees the portfolio's weights."""

    assets: torch.Tensor
    """(P, M, N, H) the asset head's first layer on [embedding, context], with bias; the weight's term comes later."""
    cash: torch.Tensor
    """(P, M, H) the cash head's first layer on the context with its bias."""
    tradable: torch.Tensor | None = None
    """(1 or P, M, N) bool, the assets that can trade on the decision day (``Observation.tradable``), or None: all."""


class Actor(nn.Module):
    """Deterministic policy of P agents: observation -> logits over N + 1 entries (cash first)."""

    def __init__(self, popsize: int, window_size: int, model: ModelConfig, *, book: Book = LONG_ONLY):
        super().__init__()
        self.popsize = popsize
        self.window_size = window_size
        self.widths = model
        self.book = book
        """What the logits become: the target weights of a long-only or a long-short book (``environment.book``)."""
        self.encoder = AssetEncoder(popsize, window_size, model)
        self.asset_head = BatchedMLP(popsize, [2 * model.embedding + 1, model.head_hidden, 1])
        self.cash_head = BatchedMLP(popsize, [model.embedding + 1, model.head_hidden, 1])

    def reset_parameters(self, generator: torch.Generator, *, share: Share | None = None) -> None:
        self.encoder.reset_parameters(generator, share=share)
        self.asset_head.reset_parameters(generator, last_scale=HEAD_INIT_SCALE, share=share)
        self.cash_head.reset_parameters(generator, last_scale=HEAD_INIT_SCALE, share=share)
        with torch.no_grad():
            self.cash_head.layers[-1].bias.add_(CASH_LOGIT)

    @torch.no_grad()
    def set_equal_weight_(self) -> None:
        """Every agent becomes the equal-weight policy: 1/N in each asset, nothing in cash, whatever it sees (in a
        long-short book too: every asset's conviction saturated long, the gross scale at 1)."""
        for head in (self.asset_head, self.cash_head):
            head.layers[-1].weight.zero_()
            head.layers[-1].bias.zero_()
        asset_logit, cash_logit = self.book.equal_weight_logits()
        self.asset_head.layers[-1].bias.fill_(asset_logit)
        self.cash_head.layers[-1].bias.fill_(cash_logit)

    def agent(self, index: int) -> Actor:
        """Agent ``index`` as a one-agent actor of its own (a copy, on the same device, without gradients)."""
        return self.agents([index])

    @torch.no_grad()
    def agents(self, indices: list[int]) -> Actor:
        """The agents ``indices``, in that order, as an actor of their own (a copy, without gradients)."""
        rows = torch.tensor(indices, dtype=torch.long, device=self.encoder.mlp.layers[0].weight.device)
        chosen = Actor(len(indices), self.window_size, self.widths, book=self.book).to(rows.device)
        for mine, theirs in zip(chosen.parameters(), self.parameters()):
            mine.copy_(theirs.index_select(0, rows))
        return chosen.requires_grad_(False)

    def features(self, obs: Observation) -> ActorFeatures:
        """What the heads compute from the market's part of M observations (windows (P or no agent dimension, M, N,
        L * K)) before the weights (``ActorFeatures``)."""
        embedding = self.widths.embedding
        emb = self.encoder(per_agent(obs.windows))  # (P, M, N, D)
        context = emb.mean(dim=2)  # (P, M, D)
        first = self.asset_head.layers[0]
        context_part = first.part(context, embedding, 2 * embedding) + first.bias  # (P, M, H), once per observation
        assets = first.part(emb, 0, embedding) + context_part.unsqueeze(2)  # (P, M, N, H)
        cash_first = self.cash_head.layers[0]
        cash = cash_first.part(context, 0, embedding) + cash_first.bias  # (P, M, H)
        tradable = obs.tradable
        if tradable is not None and tradable.dim() == 2:
            tradable = tradable.unsqueeze(0)  # (M, N) that every agent sees -> (1, M, N)
        return ActorFeatures(assets, cash, tradable)

    def decide(self, features: ActorFeatures, weights: torch.Tensor) -> torch.Tensor:
        """``features`` of M observations and their weights (P, M, N + 1) -> logits (P, M, N + 1)."""
        popsize, hidden = features.cash.shape[0], features.cash.shape[-1]
        asset_first, asset_last = self.asset_head.layers
        cash_first, cash_last = self.cash_head.layers
        embedding = self.widths.embedding
        asset_weight = asset_first.column(2 * embedding).view(popsize, 1, 1, hidden)
        asset_hidden = torch.relu(torch.addcmul(features.assets, weights[..., 1:, None], asset_weight))  # (P, M, N, H)
        asset_logits = asset_last(asset_hidden.flatten(1, 2)).view(weights[..., 1:].shape)  # (P, M, N)
        if features.tradable is not None:  # no weight on an asset without a price: masked before the softmax
            asset_logits = asset_logits.masked_fill(~features.tradable, -math.inf)
        cash_weight = cash_first.column(embedding).view(popsize, 1, hidden)
        cash_hidden = torch.relu(torch.addcmul(features.cash, weights[..., :1], cash_weight))  # (P, M, H)
        cash_logit = cash_last(cash_hidden)  # (P, M, 1)
        return torch.cat([cash_logit, asset_logits], dim=-1)

    def logits(self, obs: Observation) -> torch.Tensor:
        """M observations -> logits (P, M, N + 1)."""
        return self.decide(self.features(obs), obs.weights)

    def forward(self, obs: Observation) -> torch.Tensor:
        """Target weights (P, M, N + 1), cash first: on the simplex for a long-only book (``Book.weights``)."""
        return self.book.weights(self.logits(obs))


class Critic(nn.Module):
    """Q-functions of P agents: (observation, action) -> Q (P, M)."""

    def __init__(self, popsize: int, window_size: int, model: ModelConfig):
        super().__init__()
        self.popsize = popsize
        self.widths = model
        self.encoder = AssetEncoder(popsize, window_size, model)
        self.asset_head = BatchedMLP(popsize, [model.embedding + 2, model.head_hidden], final_activation=True)
        self.value_head = BatchedMLP(popsize, [model.head_hidden + 2, model.head_hidden, 1])

    def reset_parameters(self, generator: torch.Generator, *, share: Share | None = None) -> None:
        for module in (self.encoder, self.asset_head, self.value_head):
            module.reset_parameters(generator, share=share)

    def features(self, obs: Observation) -> torch.Tensor:
        """The market's part of M observations -> (P, M, N, H): the asset head's first layer on the embeddings, with
        bias."""
        first = self.asset_head.layers[0]
        return first.part(self.encoder(per_agent(obs.windows)), 0, self.widths.embedding) + first.bias.unsqueeze(1)

    def value(self, features: torch.Tensor, weights: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``features`` of M observations, their weights and actions (P, M, N + 1) -> Q (P, M)."""
        popsize, hidden = features.shape[0], features.shape[-1]
        embedding = self.widths.embedding
        first = self.asset_head.layers[0]
        asset_in = torch.addcmul(features, weights[..., 1:, None], first.column(embedding).view(popsize, 1, 1, hidden))
        asset_in = torch.addcmul(asset_in, actions[..., 1:, None], first.column(embedding + 1).view(popsize, 1, 1, -1))
        pooled = torch.relu(asset_in).mean(dim=2)  # (P, M, H)
        value_first = self.value_head.layers[0]
        value_in = value_first.part(pooled, 0, hidden) + value_first.bias
        value_in = torch.addcmul(value_in, weights[..., :1], value_first.column(hidden).view(popsize, 1, -1))
        value_in = torch.addcmul(value_in, actions[..., :1], value_first.column(hidden + 1).view(popsize, 1, -1))
        return self.value_head.layers[1](torch.relu(value_in))[..., 0]  # (P, M)

    def forward(self, obs: Observation, actions: torch.Tensor) -> torch.Tensor:
        """M observations and actions (P, M, N + 1) -> Q (P, M)."""
        return self.value(self.features(obs), obs.weights, actions)


def per_agent(windows: torch.Tensor) -> torch.Tensor:
    """Windows (M, N, L * K) that every agent sees as (1, M, N, L * K); windows with an agent dimension as they are."""
    return windows if windows.dim() == 4 else windows.unsqueeze(0)
