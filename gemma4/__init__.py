"""Gemma 4 text model (the *target*) in pure PyTorch: config, model, KV cache, loading, decoding. Its names are
imported from their modules on first use (PEP 562): importing the model, the cache or decoding loads no loader."""

from importlib import import_module

WHERE = {name: module for module, names in {
    "cache": "KVCache", "config": "ConfigError TextConfig", "config_file": "load_config", "engine.rows": "Request", "engine.ring": "RingCache",
    "generate": "greedy_generate sample_generate", "engine.decode": "Generated decode", "model": "Gemma4Model ModelOutput",
    "reference": "reference_greedy", "sampling": "SamplerConfig", "tokenizer": "Gemma4Tokenizer Message",
    "weights": "CheckpointError load_target",
}.items() for name in names.split()}
__all__ = sorted(WHERE)


def __getattr__(name: str) -> object:
    if name not in WHERE:
        raise AttributeError(f"module 'gemma4' has no attribute {name!r}")
    return getattr(import_module(f"gemma4.{WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
