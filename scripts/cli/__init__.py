"""The helpers of generate.py and chat.py: model options, streamed text, start-up, batches, statistics."""
