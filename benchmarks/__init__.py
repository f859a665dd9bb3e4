"""Benchmarks of subic-keras; run them as `python -m benchmarks.<name>`."""
