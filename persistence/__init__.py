"""Keeping a run durable: a generation's files (the checkpoint format, the state document, staging and the writer
thread), a run folder in one place (``run_folder``: its names, the start and resume decisions, recovery from damaged
generations, the bucket's copy), run provenance, metrics rows on disk and the storage backends (local folders, GCS).
Imports nothing from ``training`` or ``offline``."""
