"""The run's random streams: which exist, where they live, and how each is seeded from the run's one seed.

Host streams run through the whole run and their states are checkpointed. Device streams are seeded afresh each
generation from (seed, generation): nothing device-specific is checkpointed, so a run resumes on another device
type (a CUDA generator's state means nothing to a CPU one), and each generation's draws do not depend on where the
run was before. The selection gate's resamples come from one more stream, drawn once from the seed.
"""

from __future__ import annotations

import numpy as np
import torch

HOST_STREAMS = ("init", "episodes", "evolution")
"""Random streams on the CPU that run through the whole run; their states are checkpointed."""
DEVICE_STREAMS = ("exploration", "replay", "mutation")
"""Random streams on the training device, seeded afresh each generation from (seed, generation)."""
GATE_STREAM_KEY = (len(HOST_STREAMS) + len(DEVICE_STREAMS),)
"""Spawn key of the selection gate's stream: after the host children and the device streams' keys."""


def _seed_of(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, np.uint64)[0]) & 0x7FFF_FFFF_FFFF_FFFF


def make_generators(seed: int, device: torch.device) -> dict[str, torch.Generator]:
    """The host streams, seeded from independent children of ``seed``, and the device streams (seeded for
    generation 1 by ``seed_device_streams``)."""
    generators = {}
    for name, child in zip(HOST_STREAMS, np.random.SeedSequence(seed).spawn(len(HOST_STREAMS))):
        generators[name] = torch.Generator(device="cpu")
        generators[name].manual_seed(_seed_of(child))
    for name in DEVICE_STREAMS:  # on the meta device, where a build for sizing draws shapes only: the host's
        generators[name] = torch.Generator(device=device if torch.device(device).type != "meta" else "cpu")
    seed_device_streams(generators, seed, generation=1)
    return generators


def seed_device_streams(generators: dict[str, torch.Generator], seed: int, *, generation: int) -> None:
    """Seed the device streams for ``generation`` (1-based): a function of the seed and the generation only.
    Their spawn keys (stream, generation) cannot collide with the host streams' children (one key each)."""
    for index, name in enumerate(DEVICE_STREAMS):
        sequence = np.random.SeedSequence(seed, spawn_key=(len(HOST_STREAMS) + index, generation))
        generators[name].manual_seed(_seed_of(sequence))


def gate_generator(seed: int) -> torch.Generator:
    """The selection gate's stream, on the host: the same resamples for every look and every resume."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(_seed_of(np.random.SeedSequence(seed, spawn_key=GATE_STREAM_KEY)))
    return generator
