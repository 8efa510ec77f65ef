"""The algorithm: the generation loop (``loop``) and its parts: rollouts, fitness, the selection gate, evolution,
the population's split over processes, random streams, the per-generation record, and starting or resuming a run."""
