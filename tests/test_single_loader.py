"""One loader: only coreecg.loading turns a path into a model. No other module of coreecg/ or jobs/
reads weights itself (torch.load, safetensors' loads; coreecg.checkpoints reads the .pt bytes for
it), and the loader's functions give back exactly what was saved: a full pretraining method, a
fine-tuned classifier with its task, an export through from_pretrained, without touching the
caller's random generators."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from coreecg.checkpoints import BEST_FILE, ENCODER_FILE, CheckpointError, save_checkpoint, save_encoder, save_step
from coreecg.loading import load_classifier, load_encoder, load_finetuned, load_method, open_method
from coreecg.methods import build_method
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from tests.helpers import TINY, tiny_config

REPO = Path(__file__).resolve().parents[1]
# The loader (coreecg/loading/, and coreecg/weights.py: its part below the model), the checkpoint
# store it reads .pt files with, and its reader of other projects' released files
# (coreecg/model/published/files.py: below the model layer, beside the families that unpack them).
ALLOWED = ("coreecg/loading/", "coreecg/weights.py", "coreecg/checkpoints.py", "coreecg/model/published/files.py")
SMALL = [*TINY, "model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"]
LEADS = ["I", "II", "V1", "V5"]
CLASSES = ["NORM", "MI", "STTC"]


# ---------------------------------------------------------------------------- the scan


def _is_weights_read(name: str) -> bool:
    """torch.load (or torch.serialization.load), and safetensors' load, load_file, safe_open (any backend)."""
    return name in ("torch.load", "torch.serialization.load") or (
        name.split(".")[0] == "safetensors" and name.rsplit(".", 1)[-1] in ("load", "load_file", "safe_open"))


def weights_reads(source: str) -> list[tuple[int, str]]:
    """(line, qualified name) of every weights read in a module's source: the names it imports and
    every expression naming one, through the module's own aliases (`import torch as T`,
    `from safetensors.torch import load_file as lf`)."""
    tree = ast.parse(source)
    alias: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
                if _is_weights_read(f"{node.module}.{a.name}"):
                    found.append((node.lineno, f"{node.module}.{a.name}"))

    def qualified(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            name = qualified(node)
            if name and _is_weights_read(name):
                found.append((node.lineno, name))
    return sorted(set(found))


def _scan() -> dict[str, list[tuple[int, str]]]:
    """Every module of coreecg/ and jobs/ -> its weights reads (modules without any left out)."""
    out = {}
    for root in ("coreecg", "jobs"):
        for path in sorted((REPO / root).rglob("*.py")):
            reads = weights_reads(path.read_text())
            if reads:
                out[path.relative_to(REPO).as_posix()] = reads
    return out


def test_only_the_loader_and_the_checkpoint_store_read_weights():
    offenders = [f"{file}:{line}: {name}" for file, reads in _scan().items()
                 if not file.startswith(ALLOWED) for line, name in reads]
    assert offenders == [], ("these modules read weights themselves; load models through coreecg.loading "
                             "(load_encoder, load_classifier, load_finetuned, load_method):\n" + "\n".join(offenders))


def test_the_scan_sees_every_spelling_of_a_weights_read():
    source = "\n".join([
        "import torch",                                          # 1
        "import torch as T",                                     # 2
        "import safetensors.torch",                              # 3
        "from safetensors.torch import load_file as lf",         # 4
        "from safetensors import safe_open",                     # 5
        "torch.load('a.pt')",                                    # 6
        "T.load('a.pt', weights_only=True)",                     # 7
        "safetensors.torch.load(b'')",                           # 8
        "lf('m.safetensors')",                                   # 9
        "with safe_open('m.safetensors', 'pt') as f: pass",      # 10
        "torch.save({}, 'a.pt'); load_file = print; load_file('x')",   # 11: not a read (a local name)
        "reader = torch.load",                                   # 12: a reference counts too
    ])
    assert [line for line, _ in weights_reads(source)] == [4, 5, 6, 7, 8, 9, 10, 12]
    # and on the real tree it finds the two reads the loader and the store own
    reads = _scan()
    assert any(name == "torch.load" for _, name in reads["coreecg/checkpoints.py"])
    assert any(name == "safetensors.torch.load_file" for _, name in reads["coreecg/weights.py"])
    assert {"torch.load", "safetensors.torch.load_file"} <= {n for _, n in reads["coreecg/model/published/files.py"]}


# ---------------------------------------------------------------------------- round trips


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = _state(a), _state(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _changed(module: torch.nn.Module) -> torch.nn.Module:
    """Weights no fresh build has (a loader that dropped them would be caught)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return module.eval()


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A pretraining run folder: two step checkpoints (the latest a changed method) and encoder.pt."""
    run = tmp_path_factory.mktemp("pretrain")
    cfg = tiny_config(*SMALL[len(TINY):])
    torch.manual_seed(0)
    method = build_method(cfg)
    save_step(run, 1, build_method(cfg), cfg, task="pretrain", trainer={"step": 1})
    _changed(method)
    save_step(run, 7, method, cfg, task="pretrain", trainer={"step": 7}, epoch=2)
    save_encoder(run / ENCODER_FILE, method, cfg, step=7)
    return run, method


def test_load_method_gives_back_the_saved_method_and_draws_no_random_numbers(pretrain_run):
    run, saved = pretrain_run
    x = torch.randn(2, 12, 1500)
    want = saved.reconstruct(x, torch.Generator().manual_seed(3))
    for source in (run, run / "checkpoint_step000000007" / "checkpoint.pt"):
        rng = torch.get_rng_state()
        loaded = load_method(source, build_method)
        assert torch.equal(torch.get_rng_state(), rng)
        assert type(loaded.model) is type(saved) and _same_state(loaded.model, saved)
        assert not loaded.model.training
        assert loaded.entries["trainer"]["step"] == 7 and loaded.entries["epoch"] == 2
        assert loaded.config.to_dict() == tiny_config(*SMALL[len(TINY):]).to_dict()
        assert loaded.weights == run / "checkpoint_step000000007" / "checkpoint.pt"
        got = loaded.model.reconstruct(x, torch.Generator().manual_seed(3))
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_load_method_refuses_what_holds_no_method_naming_the_file(pretrain_run, tmp_path):
    run, _ = pretrain_run
    with pytest.raises(CheckpointError, match="encoder alone") as e:
        load_method(run / ENCODER_FILE, build_method)
    assert str(run / ENCODER_FILE) in str(e.value)
    with pytest.raises(CheckpointError, match="no checkpoint_step") as e:
        open_method(tmp_path)
    assert str(tmp_path) in str(e.value)
    cfg = tiny_config(*SMALL[len(TINY):])
    save_checkpoint(tmp_path / BEST_FILE, _classifier(cfg), cfg, task="finetune")
    with pytest.raises(CheckpointError, match="finetune checkpoint") as e:
        load_method(tmp_path / BEST_FILE, build_method)
    assert str(tmp_path / BEST_FILE) in str(e.value)


def _classifier(cfg) -> Classifier:
    return Classifier.for_mode(Encoder.from_config(cfg), len(CLASSES), LEADS, True, cfg.finetune.mode,
                               cfg.finetune.head)


def test_load_finetuned_gives_back_the_classifier_with_its_config_and_task(tmp_path):
    cfg = tiny_config(*SMALL[len(TINY):], f"finetune.leads={LEADS}".replace("'", ""))
    torch.manual_seed(1)
    saved = _changed(_classifier(cfg))
    save_checkpoint(tmp_path / BEST_FILE, saved, cfg, task="finetune", epoch=3, class_names=CLASSES, multilabel=True)
    x = torch.randn(3, len(LEADS), 1500)
    with torch.no_grad():
        want = saved(x)["logits"]
    for source in (tmp_path, tmp_path / BEST_FILE):
        rng = torch.get_rng_state()
        tuned = load_finetuned(source)
        assert torch.equal(torch.get_rng_state(), rng)
        assert _same_state(tuned.model, saved) and not tuned.model.training
        assert tuned.class_names == CLASSES and tuned.multilabel is True and tuned.entries["epoch"] == 3
        assert tuned.config.finetune == cfg.finetune and tuned.config.model == cfg.model
        with torch.no_grad():
            assert torch.equal(tuned.model(x)["logits"], want)
        assert _same_state(load_classifier(source), tuned.model)


def test_from_pretrained_loads_through_the_loader_like_load_encoder(tmp_path):
    cfg = tiny_config(*SMALL[len(TINY):])
    torch.manual_seed(2)
    saved = _changed(Encoder.from_config(cfg))
    saved.save_pretrained(tmp_path / "export", config=cfg)
    x = torch.randn(2, 12, 1500)
    rng = torch.get_rng_state()
    hub, ours = Encoder.from_pretrained(tmp_path / "export"), load_encoder(tmp_path / "export")
    assert torch.equal(torch.get_rng_state(), rng)
    assert _same_state(hub, saved) and _same_state(ours, saved)
    with torch.no_grad():
        assert torch.equal(hub.pooled(x), saved.pooled(x)) and torch.equal(ours.pooled(x), saved.pooled(x))
    (tmp_path / "export" / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(CheckpointError, match="sha256"):
        Encoder.from_pretrained(tmp_path / "export")
