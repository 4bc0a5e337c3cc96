"""The networks (encoder, decoders, heads, classifier): plain PyTorch, no Ray, no data loading.
The pretraining methods that combine them live in `coreecg.methods`."""
from coreecg.model.decoders import LatentDecoder, Projection, TimeDecoder
from coreecg.model.encoder import Encoded, Encoder

__all__ = ["Encoder", "Encoded", "TimeDecoder", "LatentDecoder", "Projection"]
