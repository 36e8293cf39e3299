"""Gemma 4 text model (the *target*) in pure PyTorch: config, model, KV cache, loading, decoding."""

from gemma4.cache import KVCache
from gemma4.config import ConfigError, TextConfig
from gemma4.config_file import load_config
from gemma4.generate import Generated, decode, greedy_generate, sample_generate
from gemma4.reference import reference_greedy
from gemma4.model import Gemma4Model, ModelOutput
from gemma4.sampling import SamplerConfig
from gemma4.tokenizer import Gemma4Tokenizer, Message
from gemma4.weights import CheckpointError, load_target

__all__ = [
    "CheckpointError", "ConfigError", "Gemma4Model", "Gemma4Tokenizer", "Generated", "KVCache", "Message",
    "ModelOutput", "SamplerConfig", "TextConfig", "decode", "greedy_generate", "load_config", "load_target",
    "reference_greedy", "sample_generate",
]
