"""Decoder attention layouts: which grid positions can reach which, and the FDA band init."""
import pytest
import torch

from coreecg.methods.core_ecg.fda import FrequencyDynamicAugmentation, frequency_dynamic_augment
from coreecg.config import ConfigError
from coreecg.model.decoders import TimeDecoder
from coreecg.model.encoder import Encoded
from tests.helpers import tiny_config

C, N, D = 12, 30, 16


def _decoder(layout: str, depth: int = 2) -> TimeDecoder:
    torch.manual_seed(0)
    return TimeDecoder(D, D, depth, 2, C, N, 75, layout=layout).eval()


def _reach(layout: str, src: tuple[int, int]) -> torch.Tensor:
    """(C, N) bool: which outputs change when only the encoding at grid position `src` changes."""
    dec = _decoder(layout)
    tokens = torch.randn(1, C * N, D)
    index = torch.arange(C * N)[None]
    lead_idx = torch.arange(C)
    base = dec(Encoded(tokens, index, None, (C, N)), lead_idx)
    tokens2 = tokens.clone()
    tokens2[0, src[0] * N + src[1]] += 1.0
    moved = dec(Encoded(tokens2, index, None, (C, N)), lead_idx)
    return (moved - base).abs().amax(-1)[0] > 1e-6


def test_lead_layout_keeps_leads_apart():
    reach = _reach("lead", (3, 7))
    assert reach[3].all() and not reach[torch.arange(C) != 3].any()


def test_axial_layout_reaches_every_lead_and_time_in_two_blocks():
    assert _reach("axial", (3, 7)).all()
    assert _reach("joint", (3, 7)).all()


def test_axial_single_block_is_a_lead_block():
    # with depth 1 only the within-lead block runs, which is why the config refuses it
    dec = _decoder("axial", depth=1)
    assert len(dec.transformer.blocks) == 1
    with pytest.raises(ConfigError, match=r"methods\.core\.time_decoder.*needs depth >= 2"):
        tiny_config("methods.core.time_decoder.depth=1", "methods.core.time_decoder.layout=axial")


def test_fda_band_init_protects_the_band_and_perturbs_little():
    torch.manual_seed(0)
    T, fs = 2250, 250.0
    band = FrequencyDynamicAugmentation(12, T, band=(0.65, 40.0), fs=fs)
    rand = FrequencyDynamicAugmentation(12, T)
    freq = torch.arange(T // 2 + 1) * fs / T
    in_band = (freq >= 0.65) & (freq <= 40.0)
    A = torch.sigmoid(band.weight)
    important = A >= A.quantile(0.5, dim=1, keepdim=True)
    assert important[:, in_band].all()                     # the band starts protected
    t = torch.arange(T) / fs
    x = torch.sin(2 * torch.pi * 5.0 * t).expand(4, 12, T).contiguous()   # in-band content only
    noise = torch.randn(4, 12, T // 2 + 1)

    def rel(w):
        return ((frequency_dynamic_augment(x, w, noise) - x).norm() / x.norm()).item()

    assert rel(band.weight) < 0.35 < 0.6 < rel(rand.weight)   # scaling by A ~ 0.73 vs noise in band
