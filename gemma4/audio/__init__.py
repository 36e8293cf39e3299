"""Audio input: from a WAV file to what the audio tower (E2B, E4B) or the frame embedder (12B) reads."""
