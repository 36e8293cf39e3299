"""Extras beside the textbook decoder: what a cache costs in bytes (memory.py)."""
