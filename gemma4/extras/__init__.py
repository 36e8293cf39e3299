"""Extras beside the textbook decoder: plain decoding of a batch of prompts."""
