"""Extras beside the textbook loop: batches of prompts and conversations on one cache."""
