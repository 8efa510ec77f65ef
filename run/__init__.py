"""What makes and drives a run: start and resume (``launch``), the parts built once (``parts``), the driver of the
generation loop (``trainer``), its checkpoints (``checkpointing``), records (``records``), random streams
(``streams``) and memory check (``sizing``)."""
