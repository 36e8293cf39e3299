"""The sections of benchmark.py: batches, memory, sampling, the transformers baseline, random pairs, the report."""
