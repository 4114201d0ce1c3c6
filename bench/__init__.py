"""Benchmarks: measure, never assert."""
