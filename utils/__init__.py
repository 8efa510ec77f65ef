"""Plumbing with no algorithm in it: errors, storage, checkpoint format, telemetry, plots, logging."""
