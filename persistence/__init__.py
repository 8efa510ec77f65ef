"""Keeping a run durable: the checkpoint format, staging and the writer thread, recovering from damaged generations,
run provenance, the state document, metrics rows on disk, storage backends (local folders, GCS) and the bucket
uploader. Imports nothing from ``training`` or ``offline``."""
