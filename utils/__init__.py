"""Small utilities with no algorithm and no persistence in them: errors, the command-line parser, stop signals,
progress bars, memory telemetry, TensorBoard logging, paths."""
