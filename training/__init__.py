"""The algorithm: the generation loop (``loop``) and its phases: rollouts and validation (``rollout``, ``fitness``),
the champion gate (``selection``), evolution (``evolution``) and the update phase (``update``). It knows nothing of
runs, checkpoints or records (``run``)."""
