"""The CoRe-ECG networks: plain PyTorch, no Ray, no data loading."""
from coreecg.model.core_ecg import CoReECG
from coreecg.model.decoders import LatentDecoder, Projection, TimeDecoder
from coreecg.model.encoder import Encoded, Encoder

__all__ = ["CoReECG", "Encoder", "Encoded", "TimeDecoder", "LatentDecoder", "Projection"]
