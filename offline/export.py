"""``python main.py export TARGET OUT_DIR``: the champion's actor, for use without this project.

TARGET is what ``inspect`` takes (a run folder: its newest intact generation; or one generation's folder, which
must be intact). OUT_DIR must not exist or be empty; it receives:

* ``actor.safetensors``: the champion's parameters, the ``champion.`` prefix removed and the population
  dimension (of size 1) squeezed: weights ``(in, out)``, biases ``(1, out)``.
* ``actor.json``: everything needed to rebuild the actor and its observation pipeline (widths, tickers in order,
  feature names and definitions, the user's columns among them, lookback, window layout, weights convention, the
  execution delay it trades with, which assets it may hold, cost rate, the normalisation statistics of the training
  range, the warm-up, the champion's validation score, its generation, the source), and its precision: float32,
  whatever the run trained with (``training_precision`` says what that was).
* ``README.md``: how to load and run it with plain PyTorch (a forward pass written with ``torch.nn.functional``).

The normalisation statistics are not in the checkpoint: the market is rebuilt on the CPU from the data named in
the checkpoint's config, and its fingerprint must equal the one the run recorded (else the data changed and the
statistics would not be the ones the actor was trained with). Everything is written into a temporary sibling
folder that is renamed into place, so a failure leaves no partial export.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from config import Config, conventions
from environment.book import Book
from environment.features import FEATURE_CLIP, TRADABLE, WARMUP_DAYS
from environment.market import Market
from environment.observation import window_size
from models.networks import Actor
from offline.bundle import FILES, FORMAT, PRECISION, SPEC, TENSORS, VERSION, write_bundle
from offline.procedures import TRADER_NAMES, deployed_members
from offline.stored import (
    TARGET_HELP,
    Located,
    champion_tensors,
    in_float32,
    locate,
    population_actor,
    read_generation,
    training_precision,
)
from persistence import checkpoint
from utils.cli import parse_command
from utils.errors import CheckpointError, InputError


def check_out_dir(out_dir: Path) -> None:
    """InputError unless ``out_dir`` is missing or an empty folder (an export never overwrites anything)."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise InputError(f"export folder {out_dir} exists and is not a folder; choose a new folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise InputError(f"export folder {out_dir} exists and is not empty; choose a new or empty folder")


def _champion(gen: checkpoint.GenerationFiles, config: Config, window_size: int) -> dict[str, torch.Tensor]:
    """The champion's parameters by ``Actor`` name, population dim squeezed: weights (in, out), biases (1, out)."""
    template = Actor(1, window_size, in_float32(config).model, book=Book.from_env(config.env))
    shapes = {name: tuple(p.shape) for name, p in template.named_parameters()}
    tensors = champion_tensors(gen, list(shapes))
    params = {}
    for name, shape in shapes.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"{gen.path}: champion.{name} has shape {tuple(tensor.shape)}, its config implies {shape}"
            )
        params[name] = tensor[0].contiguous()
    return params


def _procedure(
    gen: checkpoint.GenerationFiles, config: Config, market: Market, window_size: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The parameters of the procedure ``selection.deploy`` names, as the bundle holds them (one agent squeezed; an
    ensemble's members as ``member{j}.NAME``), and ``actor.json``'s ``procedure``."""
    deploy = config.selection.deploy
    if deploy == "champion":
        return _champion(gen, config, window_size), {"deploy": deploy, "members": []}
    population = population_actor(gen, config, window_size)
    chosen = deployed_members(market, in_float32(config), population)
    tensors = dict(population.named_parameters())
    if len(chosen) == 1:
        params = {name: tensor[chosen[0]].contiguous() for name, tensor in tensors.items()}
    else:
        params = {f"member{j}.{name}": t[i].contiguous() for j, i in enumerate(chosen) for name, t in tensors.items()}
    return params, {"deploy": deploy, "members": chosen}


def actor_spec(
    *,
    config: Config,
    market: Market,
    params: dict[str, torch.Tensor],
    state: dict[str, Any],
    gen: checkpoint.GenerationFiles,
    run_dir: Path | None,
) -> dict[str, Any]:
    """The contents of ``actor.json``."""
    if market.feature_mean is None or market.feature_std is None:
        raise ValueError("the market has no normalisation statistics")
    lookback, num_assets, num_features = config.env.lookback, market.num_assets, market.num_features
    delay, long_short = config.env.execution_delay, Book.from_env(config.env).long_short
    train, validation, holdout = market.splits.train, market.splits.validation, market.splits.holdout

    def span(days: range) -> list[str]:
        return [market.dates[days.start], market.dates[days.stop - 1]]

    return {
        "format": FORMAT,
        "format_version": VERSION,
        "precision": PRECISION,
        "training_precision": training_precision(config, state.get("device")),
        "architecture": {
            "network": "per-asset encoder shared by all assets, then an asset head and a cash head (see README.md)",
            "window_size": lookback * num_features,
            "encoder_hidden": config.model.encoder_hidden,
            "embedding": config.model.embedding,
            "head_hidden": config.model.head_hidden,
            "tensors": {name: list(t.shape) for name, t in params.items()},
            "linear_layout": "weight (in, out), bias (1, out): y = x @ weight + bias",
        },
        "tickers": list(market.tickers),
        "feature_names": list(market.feature_names),
        "feature_definitions": dict(zip(market.feature_names, market.feature_definitions, strict=True)),
        "lookback": lookback,
        "warmup_days": WARMUP_DAYS,
        "observation": observation_spec(num_assets, lookback * num_features, delay, long_short=long_short),
        "action": action_spec(num_assets, delay, long_short=long_short),
        "execution_delay": delay,
        "book": book_spec(config),
        "universe": config.data.universe,
        "tradable": TRADABLE in market.feature_names,
        "cash": conventions(config)["cash"],
        "cost_rate": config.env.cost_rate,
        "normalisation": {
            "shape": [num_assets, num_features],
            "mean": market.feature_mean.cpu().tolist(),
            "std": market.feature_std.cpu().tolist(),
            "clip": FEATURE_CLIP,
            "formula": "normalised[n, k] = clip((raw[n, k] - mean[n, k]) / std[n, k], -clip, clip)",
            "statistics_of": "the training range " + " to ".join(span(train)),
        },
        "dates": {
            "first": market.dates[0],
            "last": market.dates[-1],
            "train": span(train),
            "validation": span(validation),
            "holdout": span(holdout),
        },
        "champion_score": state.get("champion_score"),
        "champion_bound": state.get("champion_bound"),
        "champion_generation": state.get("champion_generation"),
        "generation": gen.generation,
        "source": {
            "run_dir": None if run_dir is None else str(run_dir),
            "run_name": config.checkpoint.run_name or (run_dir.name if run_dir is not None else None),
            "generation_dir": str(gen.path),
            "data": config.data.path or "bundled",
            "market_fingerprint": state.get("market_fingerprint"),
            "config": config.to_dict(),
        },
    }


def observation_spec(num_assets: int, window_size: int, delay: int, *, long_short: bool) -> dict[str, Any]:
    """What ``actor.json`` says an observation is: its windows, weights and tradable assets, as the actor reads them
    at ``execution_delay`` ``delay``, in a long-only or a ``long_short`` book."""
    return {
        "windows": {
            "shape": [num_assets, window_size],
            "layout": "asset n (tickers order), then day-major: index d * K + k holds feature k of day "
            "t - L + 1 + d (d = 0 oldest, d = L - 1 the decision day t), K = len(feature_names)",
        },
        "weights": {
            "shape": [num_assets + 1],
            "layout": "portfolio weights, cash first, then the tickers in order; "
            + (
                "signed (a short is negative), sum 1: cash is 1 minus the assets' sum, negative for a loan; "
                if long_short
                else "non-negative, sum 1; "
            )
            + "a new portfolio is all cash [1, 0, ..., 0]; "
            + (
                "after a day they are the targets drifted with prices (the holdings at the close of t)"
                if delay == 0
                else "after a day they are the previous decision's target weights (the last order sent): as it "
                "filled at the close of t with execution_delay 1 (an asset without a price there kept what was "
                "held in it), as it was sent with a longer delay in a market whose assets do not all trade every "
                "day"
            ),
        },
        "tradable": {
            "shape": [num_assets],
            "layout": "1 where the asset has a price at the close of t, else 0: the actor puts no weight on "
            "the others (their logits are -inf); all 1 when every asset trades every day",
        },
    }


def action_spec(num_assets: int, delay: int, *, long_short: bool) -> dict[str, Any]:
    """What ``actor.json`` says an action is: target weights of its book (long-only or ``long_short``), and when they
    fill at ``execution_delay`` ``delay``."""
    return {
        "shape": [num_assets + 1],
        "meaning": "target weights, cash first: "
        + (
            "the long-short book's weights of the actor's logits, within its limits (see book); "
            if long_short
            else "softmax of the actor's logits; "
        )
        + (
            "they fill at the close of t and are held to the close of t + 1"
            if delay == 0
            else f"they fill at the close of t + {delay} (execution_delay trading days after the decision) and "
            f"are held to the close of t + {delay + 1}; an asset without a price at the fill keeps what is held "
            "in it and the other weights, cash included, are scaled to fill the rest"
        ),
    }


_FORWARD_CODE = '''\
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def load_actor(folder):
    """The actor's tensors (name -> tensor) and its spec (actor.json) from an export folder."""
    folder = Path(folder)
    return load_file(folder / "__TENSORS__"), json.loads((folder / "__SPEC__").read_text())


def mlp(params, prefix, x, final_relu=False):
    """Linear layers prefix.0, prefix.1, ... with ReLU between them; weights are (in, out), biases (1, out)."""
    count = len({name.split(".")[-2] for name in params if name.startswith(prefix + ".")})
    for i in range(count):
        x = F.linear(x, params[f"{prefix}.{i}.weight"].T, params[f"{prefix}.{i}.bias"][0])
        if i < count - 1 or final_relu:
            x = F.relu(x)
    return x


def actor_logits(params, windows, weights, tradable=None):
    """windows (..., N, L*K) normalised features, weights (..., N+1) cash first, tradable (..., N) bool (None: every
    asset has a price today) -> logits (..., N+1); an asset without a price gets -inf: no weight."""
    emb = mlp(params, "encoder.mlp.layers", windows, final_relu=True)  # (..., N, D), same encoder per asset
    context = emb.mean(dim=-2, keepdim=True)  # (..., 1, D)
    asset_in = torch.cat([emb, context.expand_as(emb), weights[..., 1:, None]], dim=-1)
    asset_logits = mlp(params, "asset_head.layers", asset_in)[..., 0]  # (..., N)
    if tradable is not None:
        asset_logits = asset_logits.masked_fill(~tradable, float("-inf"))
    cash_logit = mlp(params, "cash_head.layers", torch.cat([context[..., 0, :], weights[..., :1]], dim=-1))
    return torch.cat([cash_logit, asset_logits], dim=-1)  # (..., N+1)


def target_weights(params, windows, weights, tradable=None, book=None):
    """The actor's action: target portfolio weights (..., N+1), cash first. A long-only book (book None or
    spec["book"] of kind long_only): the softmax of the logits. A long-short one (spec["book"]): each asset's
    tanh(logit), scaled to a gross of G * sigmoid(-cash logit), then within the book's limits."""
    logits = actor_logits(params, windows, weights, tradable)
    if book is None or book["kind"] == "long_only":
        weights = F.softmax(logits, dim=-1)
        if book is None or book["max_weight"] >= 1:
            return weights
        assets = weights[..., 1:].clamp(max=book["max_weight"])
        return torch.cat([1 - assets.sum(-1, keepdim=True), assets], dim=-1)
    assets = logits[..., 1:]
    conviction = torch.where(torch.isinf(assets), torch.zeros_like(assets), torch.tanh(assets))
    gross = book["gross_leverage"] * torch.sigmoid(-logits[..., :1])
    assets = gross * conviction / conviction.abs().sum(-1, keepdim=True).clamp(min=1.0)
    assets = assets.clamp(-book["max_weight"], book["max_weight"])
    total = assets.abs().sum(-1, keepdim=True)
    most = book["gross_leverage"]
    assets = assets * torch.where(total > most, most / total.clamp(min=1e-30), torch.ones_like(total))
    longs, shorts = assets.clamp(min=0), assets.clamp(max=0)
    net = assets.sum(-1, keepdim=True)
    long_sum, short_sum = longs.sum(-1, keepdim=True), -shorts.sum(-1, keepdim=True)
    low, high = book["net_exposure"]
    long_room, short_room = (long_sum - (net - high)).clamp(min=0), (short_sum - (low - net)).clamp(min=0)
    long_scale = torch.where(long_sum > long_room, long_room / long_sum.clamp(min=1e-30), torch.ones_like(long_sum))
    short_scale = torch.where(short_sum > short_room, short_room / short_sum.clamp(min=1e-30), torch.ones_like(net))
    assets = longs * long_scale + shorts * short_scale
    return torch.cat([1 - assets.sum(-1, keepdim=True), assets], dim=-1)


def members(params):
    """The agents whose orders are averaged: one parameter dict each (an ensemble's tensors are named
    member{j}.NAME; a single actor is its own only member)."""
    names = sorted({name.split(".", 1)[0] for name in params if name.startswith("member")})
    if not names:
        return [params]
    return [{k.split(".", 1)[1]: v for k, v in params.items() if k.split(".", 1)[0] == m} for m in names]


def procedure_weights(params, windows, weights, tradable=None, book=None):
    """The order: the mean of every member's target weights, each deciding on the same held weights."""
    each = [target_weights(p, windows, weights, tradable, book) for p in members(params)]
    return torch.stack(each).mean(dim=0)


def normalise(raw, spec):
    """Raw features (..., N, K) -> the normalised features the actor was trained on; a missing raw value (NaN: an
    asset without a price that day, or a value not known yet) becomes 0, the training mean. With a "tradable"
    feature, its raw value (1 or 0) passes unchanged (its mean is 0 and its std 1)."""
    norm = spec["normalisation"]
    mean = torch.tensor(norm["mean"], dtype=raw.dtype)
    std = torch.tensor(norm["std"], dtype=raw.dtype)
    return torch.nan_to_num(((raw - mean) / std).clamp(-norm["clip"], norm["clip"]), nan=0.0)


def window(days):
    """The last L days of normalised features (L, N, K), oldest first -> one observation window (N, L*K)."""
    lookback, num_assets, num_features = days.shape
    return days.permute(1, 0, 2).reshape(num_assets, lookback * num_features)
'''

_USAGE_CODE = """\
params, spec = load_actor("{folder}")  # this folder
raw = ...  # (L, N, K) float32 raw features of the last L days, oldest first, tickers and features in spec order
tradable = ...  # (N,) bool: which tickers have a price at today's close (None if all always do)
weights = torch.zeros(len(spec["tickers"]) + 1)
weights[0] = 1.0  # a new portfolio: all cash
with torch.no_grad():
    target = procedure_weights(params, window(normalise(raw, spec)), weights, tradable, spec["book"])  # (N+1,)
"""


def book_spec(config: Config) -> dict[str, Any]:
    """The book the actor's weights are for (``environment.book``), as the export's ``actor.json`` states it."""
    book = Book.from_env(config.env)
    return {
        "kind": book.kind,
        "gross_leverage": book.gross_leverage,
        "net_exposure": [book.net_low, book.net_high],
        "max_weight": book.max_weight,
        "rebalance_every": book.rebalance_every,
        "borrow_rate": config.env.borrow_rate if book.long_short else 0.0,
        "financing_spread": config.env.financing_spread if book.long_short else 0.0,
        "described": conventions(config)["book"],
    }


def procedure_text(procedure: dict[str, Any]) -> str:
    """The deployed procedure in words: which agents trade (``offline.procedures``)."""
    chosen = procedure["members"]
    agents = f"agent{'s' if len(chosen) != 1 else ''} {', '.join(map(str, chosen))}"
    return (
        f"{TRADER_NAMES[procedure['deploy']]} (selection.deploy={procedure['deploy']}: {agents} of the population, "
        "ranked by validation log return, no gate)"
    )


def forward_code() -> str:
    """The README's plain-PyTorch code, reading the bundle's files by the names ``offline.bundle`` gives them."""
    return _FORWARD_CODE.replace("__TENSORS__", TENSORS).replace("__SPEC__", SPEC)


def readme_text(spec: dict[str, Any], folder_name: str) -> str:
    """``README.md`` of an export: what the files are, the observation pipeline, and a forward pass in PyTorch."""
    tickers = spec["tickers"]
    num_assets, lookback = len(tickers), spec["lookback"]
    num_features = len(spec["feature_names"])
    arch = spec["architecture"]
    features = "\n".join(f"* `{name}`: {text}" for name, text in spec["feature_definitions"].items())
    source = spec["source"]
    procedure = spec.get("procedure") or {"deploy": "champion", "members": []}
    who = _who_text(spec, procedure)
    weights_text, fill_text = _fill_texts(spec["execution_delay"])
    return f"""# Exported ERL trader actor

{who}: total log return over the validation range {spec["dates"]["validation"][0]} to
{spec["dates"]["validation"][1]}, one episode from cash), trained on {num_assets} assets
({", ".join(tickers)}) with data `{source["data"]}`.{_members_text(procedure)}

| file | what it holds |
|---|---|
| `actor.safetensors` | the actor's {len(arch["tensors"])} tensors; linear weights `(in, out)`, biases `(1, out)` |
| `actor.json` | architecture, tickers, features, lookback, normalisation statistics, conventions, provenance |
| `README.md` | this file |

## Observation

At the close of day `t` the actor sees:

* `windows`, shape `({num_assets}, {lookback * num_features})`: for each asset (in `tickers` order) the last
  {lookback} days (`lookback`) of its {num_features} features, oldest day first, flattened day-major: entry
  `d * {num_features} + k` is feature `k` of day `t - {lookback - 1} + d`;
* `weights`, shape `({num_assets + 1},)`: {weights_text}, **cash first**, then the assets in
  `tickers` order; a new portfolio is all cash `[1, 0, ..., 0]`;
* `tradable`, shape `({num_assets},)`: which assets have a price at the close of `t`; the actor puts no weight on the
  others (`None` when every asset always has one).

Raw features of day `t` use what is known at the close of `t` only (`feature_names` order); a value dated `t` in a
column of the data file counts as known at the close of `t`:

{features}

The exponential averages have no finite window: compute them from at least `warmup_days` ({spec["warmup_days"]})
trading days before the first decision, as training did. Each raw feature is normalised per (asset, feature)
with the statistics of the training range {spec["dates"]["train"][0]} to {spec["dates"]["train"][1]} in
`actor.json["normalisation"]`: `clip((raw - mean) / std, -{spec["normalisation"]["clip"]}, \
{spec["normalisation"]["clip"]})`.

## Action

`target_weights` returns the target weights, shape `({num_assets + 1},)`, cash first, for the book in
`actor.json["book"]`: {spec["book"]["described"]} (long-only: a softmax of the logits; long-short: each asset's
`tanh` of its logit, scaled to a gross of `gross_leverage * sigmoid(-cash logit)`, clipped to `max_weight`, then the
gross and the net shrunk into their bounds). {fill_text}; training charged `cost_rate` = {spec["cost_rate"]} per
unit of turnover (the sum of absolute weight changes over the assets); a long-short book also paid `borrow_rate` a
year on its shorts' value and `financing_spread` over cash's rate on a loan for longs beyond its value. With
`rebalance_every` k > 1 it decided every k-th trading day from its first and held (drifting) in between: act on
those days only.

## Running it with PyTorch

Needs only `torch` and `safetensors`; nothing from the training project. Every function accepts any leading
batch dimensions.

```python
{forward_code()}```

For one decision:

```python
{_USAGE_CODE.format(folder=folder_name)}```

The architecture: one encoder MLP ({arch["window_size"]} → {arch["encoder_hidden"]} → {arch["embedding"]}, ReLU
after each layer) embeds every asset's window with the same weights; the asset head maps
[embedding, mean embedding over assets, the asset's current weight] → {arch["head_hidden"]} → 1 logit per asset;
the cash head maps [mean embedding, cash weight] → {arch["head_hidden"]} → 1 logit.

Precision: the tensors are float32 and the actor runs in float32 (`precision` in `actor.json`), as `python main.py
evaluate` scored it.{_trained_precision_text(spec)}
"""


def _who_text(spec: dict[str, Any], procedure: dict[str, Any]) -> str:
    """Which agent of which run the export is, and its validation score (the README's first sentence, cut where the
    score's explanation follows)."""
    source, score = spec["source"], spec["champion_score"]
    score_text = "n/a" if score is None else f"{score:+.4f}"
    found = (
        "equal weight: no agent's edge over it passed the selection test"
        if spec["champion_generation"] == 0
        else f"found in generation {spec['champion_generation']}"
    )
    if procedure["deploy"] == "champion":
        who = f"The champion of run `{source['run_name']}` at generation {spec['generation']} ({found}; validation "
        return who + f"score\n{score_text}"
    who = f"The {procedure_text(procedure)} of run `{source['run_name']}` at generation {spec['generation']} "
    return who + f"(the run's champion: {found}; its validation score\n{score_text}"


def _fill_texts(delay: int) -> tuple[str, str]:
    """What the observation's weights are, and when the action fills, at ``execution_delay`` ``delay``."""
    if delay == 0:
        return "the portfolio's current weights (the last targets, drifted with prices)", (
            "Training filled them at the close of `t` itself, which no one can trade (`execution_delay` 0: an "
            "optimistic convention), and held them to the close of `t + 1`"
        )
    return "the previous decision's target weights (the last order sent, as it filled)", (
        f"Send them after the close of `t`: training filled them at the close of `t + {delay}` "
        f"(`execution_delay` {delay}) and held them to the close of `t + {delay + 1}`; weight on an asset "
        "without a price at the fill stayed in cash"
    )


def _members_text(procedure: dict[str, Any]) -> str:
    if len(procedure["members"]) < 2:
        return ""
    return (
        f" The trader is an ensemble of {len(procedure['members'])} agents: `actor.safetensors` holds each one's "
        "tensors as `member{j}.NAME`, each decides on the same held weights, and the order is the mean of their target "
        "weights (`procedure_weights` below)."
    )


def _trained_precision_text(spec: dict[str, Any]) -> str:
    trained = spec["training_precision"]
    kinds = []
    if trained["bf16_encoder"]:
        kinds.append("bfloat16 autocast in its per-asset encoder")
    if trained["matmul_precision"] != "highest":
        kinds.append(f"`runtime.matmul_precision={trained['matmul_precision']}` (TF32 matmuls on CUDA)")
    if not kinds:
        return ""
    return (
        f" The run trained with {' and '.join(kinds)}, so its float32 outputs can differ slightly from those "
        "training computed."
    )


def export_champion(target: str | Path, out_dir: str | Path, *, log: Callable[[str], None] = print) -> Path:
    """Write the champion's actor of a checkpoint to ``out_dir`` (see the module docstring).

    Raises:
        InputError: ``out_dir`` exists and is not an empty folder, or the target cannot be read.
        CheckpointError: The generation is damaged, has no champion, or the data it was trained on changed.
        DataError: The data named in the checkpoint's config cannot be loaded.
    """
    out_dir = Path(out_dir).expanduser()
    check_out_dir(out_dir)
    with tempfile.TemporaryDirectory(prefix="erl-export-") as scratch:
        return _export(locate(target, Path(scratch)), out_dir, log=log)


def _export(located: Located, out_dir: Path, *, log: Callable[[str], None]) -> Path:
    gen = located.gen
    state, config, market = read_generation(located, refusal="cannot export from")
    params, procedure = _procedure(gen, config, market, window_size(config.env.lookback, market.num_features))
    spec = actor_spec(config=config, market=market, params=params, state=state, gen=gen, run_dir=located.run_dir)
    spec["procedure"] = procedure

    check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_bundle(tmp, params, spec, readme_text(spec, out_dir.name))
        if out_dir.is_dir():
            out_dir.rmdir()  # empty (checked above); rename cannot replace a folder on every platform
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    score = spec["champion_score"]
    found = "equal weight" if spec["champion_generation"] == 0 else f"found in generation {spec['champion_generation']}"
    score_text = "n/a" if score is None else format(score, "+.4f")
    what = (
        f"the champion of {gen.path} ({found}, validation log return {score_text})"
        if procedure["deploy"] == "champion"
        else f"the {procedure_text(procedure)} of {gen.path}"
    )
    log(f"exported {what} to {out_dir}: {', '.join(FILES)}")
    return out_dir


def main(argv: Sequence[str]) -> int:
    """``export``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    args = parse_command(
        argv,
        "export",
        "Write a checkpoint's champion actor (safetensors, JSON spec, README with a PyTorch forward pass).",
        ("target", {"help": TARGET_HELP}),
        ("out_dir", {"help": "a new or empty folder for actor.safetensors, actor.json and README.md"}),
    )
    export_champion(args.target, args.out_dir)
    return 0
