"""Small model configs for fast tests (benchmarks use the paper's sizes)."""
from coreecg.config import load_config

TINY = [
    "model.embed_dim=32", "model.depth=2", "model.num_heads=2",
    "model.time_decoder_dim=32", "model.time_decoder_depth=2", "model.time_decoder_heads=2",
    "model.latent_decoder_dim=32", "model.latent_decoder_depth=1", "model.latent_decoder_heads=2",
    "model.proj_hidden_dim=64", "model.proj_dim=32",
]


def tiny_config(*overrides: str):
    return load_config(overrides=[*TINY, *overrides])
