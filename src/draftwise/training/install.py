"""Copy a build's finished models into a zoo folder (by default the package's), weights in fp16.

The safetensors hold fp16 tensors (half the bytes) while ``config.json`` keeps
``dtype: float32``, so ``from_pretrained`` upcasts on load and CPU inference runs in fp32.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftwise.errors import DraftwiseError
from draftwise.training.build import GENERALIST, TARGET
from draftwise.training.corpus import DOMAINS, SPECIALIST_DOMAINS
from draftwise.zoo.load import MANIFEST, shipped_models_dir

log = logging.getLogger(__name__)

BUILD_SUMMARY_KEYS = ("budget", "seed", "environment", "corpus", "train_tokens_per_domain", "target_mix_tokens",
                      "target", "drafters", "stage_seconds")


def model_roles() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Zoo model name → (role, domains it learned from)."""
    roles: dict[str, tuple[str, tuple[str, ...]]] = {TARGET: ("target", DOMAINS), GENERALIST: ("drafter", DOMAINS)}
    roles.update({d: ("drafter", (d,)) for d in SPECIALIST_DOMAINS})
    return roles


def install_model(source: Path, dest: Path) -> int:
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    if dest.exists():
        shutil.rmtree(dest)
    model.half().save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(dest))
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"  # load (upcast) in fp32: CPU fp16 kernels are slow
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return params


def install_zoo(build: Path, dest: Path | None = None) -> Path:
    dest = dest or shipped_models_dir()
    models = build / "models"
    missing = [name for name in model_roles() if not (models / name / "model.safetensors").exists()]
    if missing:
        raise DraftwiseError(
            f"zoo install: {build} lacks finished models {missing}; finish `draftwise zoo build` first")
    dest.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, (role, domains) in model_roles().items():
        params = install_model(models / name, dest / name)
        entries.append({"name": name, "role": role, "domains": list(domains), "params": params})
        log.info("installed %s (%d params)", name, params)
    # entries this build does not make (white-box heads, installed by `draftwise zoo heads`) stay
    previous = json.loads((dest / MANIFEST).read_text()).get("models", []) if (dest / MANIFEST).exists() else []
    entries += [e for e in previous if e.get("name") not in model_roles() and (dest / e.get("name", "")).is_dir()]
    meta_path = build / "build.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    manifest = {"models": entries, "build": {k: meta[k] for k in BUILD_SUMMARY_KEYS if k in meta}}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dest
