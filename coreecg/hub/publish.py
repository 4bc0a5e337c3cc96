"""An export folder onto the Hugging Face Hub, whole: the documented way to publish.

    from coreecg.hub import push_export
    push_export("exports/ft-ptbxl", "user/ecg-ptbxl")     # needs a Hub token (HF_TOKEN or login)

`Classifier.push_to_hub` uploads what `save_pretrained` writes; this uploads the export as it
is: coreecg's model card (licence, datasets), config.json with the input contract and
provenance, the weights, the pretraining fingerprints the leakage guard reads, model.onnx.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import HfApi

from coreecg.checkpoints import CheckpointError
from coreecg.hub.card import CARD_FILE
from coreecg.hub.onnx_export import ONNX_FILE
from coreecg.weights import CONFIG_FILE, read_folder


def push_export(folder: str | Path, repo_id: str, *, token: str | None = None, private: bool | None = None,
                revision: str | None = None, commit_message: str = "Upload coreecg export") -> Any:
    """Upload the export at `folder` to the model repository `repo_id` (created if missing) in one
    commit -> the Hub's CommitInfo. The folder is verified first (read_folder: format, the
    weights' sha256), and must hold its card and every file config.json names: CheckpointError
    naming the folder otherwise, before any network access."""
    folder = Path(folder).expanduser()
    saved = read_folder(folder)
    weights = saved.weights.name
    fp = ((((saved.meta.get("provenance") or {}).get("pretraining") or {}).get("corpus") or {})
          .get("fingerprints") or {}).get("file")
    named = [CONFIG_FILE, weights, CARD_FILE] + ([fp] if fp else []) + ([ONNX_FILE] if saved.meta.get("onnx") else [])
    missing = [name for name in named if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: not a whole export (missing {', '.join(missing)}); "
                              "write it with jobs/export.py")

    api = HfApi(token=token)
    repo = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    return api.upload_folder(repo_id=repo.repo_id, repo_type="model", folder_path=folder,
                             allow_patterns=named, revision=revision, commit_message=commit_message)
