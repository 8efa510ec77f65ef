"""Market data: loading and validating price files, features and splits, and the environments."""
