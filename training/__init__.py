"""The algorithm: the generation loop (``loop``), the parts it is built from once (``parts``: rollouts and validation,
the update phase, the selection gate, the random streams, the population's split over processes), where device
results come to the host (``boundary``), CUDA graphs around the device steps (``graphs``), checkpointing the loop,
the per-generation record, and a run's device and data, start and resume."""
