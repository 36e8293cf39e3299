"""Extras beside the textbook loop: conversations on one cache (batches run in the loop itself)."""
