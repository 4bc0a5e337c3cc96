"""The published families at their published sizes: parameters, GFLOP of one forward pass per 10 s
record, and CPU records/s of `embed` (coreecg.model.published; docs/published_encoders.md).

    python -m bench.published_encoders                     # every family and released size
    python -m bench.published_encoders --models ecgfounder-12,xecg
    python -m bench.published_encoders --quick             # the fixtures' own files (reduced sizes): a smoke run

Each model is built from its family's options at a released size (the options' defaults are the
published model; MERL's and HuBERT-ECG's other releases by their sizes) with random weights: what
is measured is the architecture, not the weights. The record is the fixtures' real PTB-XL record
(12 leads, 10 s at 500 Hz, ../shared/fixtures/published/*/raw.npy). Per model:

- parameters: of the encoder (heads, decoders and text towers are not loaded);
- gflop_per_record: one forward pass over the windows the family's contract makes of that 10 s
  record (ECG-FM: two 5 s windows; HuBERT-ECG: its first 5 s), counted by torch's FlopCounterMode
  (matrix products and convolutions; attention through SDPA's math kernel, which the counter sees);
- records_per_s: `embed` on the CPU, the contract's preprocessing of each record plus the pooled
  forward of a batch of `--batch` records' windows, the median of `--repeats` timed batches after one
  warm-up, at torch's thread count (recorded).

Prints one JSON object: the machine, and per model its figures.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import coreecg
from bench.common import REPO, cpu_name, emit, parser, progress
from coreecg.config import Config
from coreecg.config.encoders import EncoderOptions
from coreecg.encoders.build import build_encoder
from coreecg.model.published import FAMILIES, contract_of
from coreecg.model.published.registry import model_layout, published_config

PUBLISHED = REPO.parent / "shared" / "fixtures" / "published"

# (model, family, leads of its file, a released size other than the defaults: its file's name, or sizes)
MODELS = [
    ("ecgfounder-12", "ecgfounder", 12, {}),
    ("ecgfounder-1", "ecgfounder", 1, {}),
    ("merl-resnet18", "merl", 12, {}),
    ("merl-vit_tiny", "merl", 12, "vit_tiny_best_encoder.pth"),
    ("ecgfm_ked", "ecgfm_ked", 12, {}),
    ("hubert_ecg-small", "hubert_ecg", 12, {"hidden_size": 512, "num_layers": 8, "num_heads": 8,
                                            "intermediate_size": 2048}),
    ("hubert_ecg-base", "hubert_ecg", 12, {}),
    ("xecg", "xecg", 12, {}),
    ("ecg_fm", "ecg_fm", 12, {}),
    ("ecg_jepa", "ecg_jepa", 8, {}),
    ("ecg_cpc", "ecg_cpc", 12, {}),
]
# the fixtures' files for --quick
QUICK = {"ecgfounder-12": "ecgfounder/12_lead_ECGFounder.pth", "ecgfounder-1": "ecgfounder/1_lead_ECGFounder.pth",
         "merl-resnet18": "merl/res18_best_encoder.pth", "merl-vit_tiny": "merl/vit_tiny_best_encoder.pth",
         "ecgfm_ked": "ecgfm_ked/best_valid_all_increase_with_augment_epoch_3.pt", "hubert_ecg-small": "hubert_ecg",
         "hubert_ecg-base": "hubert_ecg", "xecg": "xecg", "ecg_fm": "ecg_fm/mimic_iv_ecg_physionet_pretrained.pt",
         "ecg_jepa": "ecg_jepa/multiblock_epoch100.pth", "ecg_cpc": "ecg_cpc/last_11597276.ckpt"}


def published_size(family: str, n_leads: int, sizes) -> torch.nn.Module:
    """The family's module at a released size (`published_config`: its options' defaults, or the
    release a file name says; a dict: those sizes over the defaults), random weights (the caller's
    RNG untouched)."""
    sections = published_config(family, sizes if isinstance(sizes, str) else "", n_leads)
    if isinstance(sizes, dict) and sizes:
        options = dataclasses.replace(getattr(sections["encoders"], family), **sizes)
        sections["encoders"] = EncoderOptions({family: options})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_encoder(Config(**sections)).eval()


def forward_gflop(encoder: torch.nn.Module, windows: torch.Tensor) -> float:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, sdpa_kernel(SDPBackend.MATH):
        encoder.pooled(*model_layout(encoder, windows))
    return counter.get_total_flops() / 1e9


def measure(name: str, encoder: torch.nn.Module, contract, raw: np.ndarray, leads: list[str], batch: int,
            repeats: int) -> dict:
    windows = torch.from_numpy(contract.windows(raw, 500, leads))          # (W, C, T') stored form
    per_record = windows.shape[0]
    t0 = time.perf_counter()
    for _ in range(repeats):
        contract.windows(raw, 500, leads)
    pre_s = (time.perf_counter() - t0) / repeats
    x = windows.repeat(batch, 1, 1)
    with torch.no_grad():
        encoder.pooled(*model_layout(encoder, x))                          # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            encoder.pooled(*model_layout(encoder, x))
            times.append(time.perf_counter() - t0)
    forward_s = statistics.median(times)
    return {"parameters": sum(p.numel() for p in encoder.parameters()),
            "windows_per_record": per_record, "window": list(windows.shape[1:]),
            "gflop_per_record": round(forward_gflop(encoder, windows), 3),
            "preprocess_ms_per_record": round(1e3 * pre_s, 2),
            "forward_ms_per_record": round(1e3 * forward_s / batch, 2),
            "records_per_s": round(batch / (batch * pre_s + forward_s), 2)}


def main() -> None:
    p = parser(__doc__, "the fixtures' reduced-size files, batch 2, 2 repeats")
    p.add_argument("--models", default=",".join(m for m, *_ in MODELS), help="comma list of models")
    p.add_argument("--batch", type=int, default=8, help="records per timed forward")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    batch, repeats = (2, 2) if args.quick else (args.batch, args.repeats)
    raw = np.load(PUBLISHED / "merl" / "raw.npy")
    leads = json.loads((PUBLISHED / "merl" / "raw.json").read_text())["leads"]
    wanted = args.models.split(",")
    out = {"machine": {"cpu": cpu_name(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
           "record": "ptbxl/records500/00000/00003_hr (12 leads, 10 s at 500 Hz)", "batch": batch,
           "repeats": repeats, "quick": args.quick, "models": {}}
    for name, family, n_leads, sizes in MODELS:
        if name not in wanted:
            continue
        progress(f"{name} ...")
        if args.quick:
            encoder = coreecg.load_encoder(PUBLISHED / QUICK[name])
        else:
            encoder = published_size(family, n_leads, sizes)
        contract = contract_of(FAMILIES[family], encoder.n_leads)
        out["models"][name] = {"family": family, "file": QUICK[name] if args.quick else "published size",
                               **measure(name, encoder, contract, raw, leads, batch, repeats)}
        progress(out["models"][name])
    emit(out)


if __name__ == "__main__":
    main()
