"""Damaged model files, fuzzed: GGUF files and safetensors folders that are cut short, are not what their name
says, hold tensors of the wrong shapes or lack weights give one clear DraftwiseError (one line and exit 2 at the
command line), never a traceback. A folder without tokenizer files still loads, for token ids only.

The files are small and made here: a tiny Llama GGUF written with the ``gguf`` package, and copies of the tiny
Llama checkpoint of conftest.py."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from draftwise.cli import main
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.models.named_models import gguf_folder

gguf = pytest.importorskip("gguf")

HIDDEN, FFN, HEADS = 8, 16, 2
TOKENS = ["<s>", "</s>", "a", "b", "c", "d", "ab"]


def write_gguf(path: Path, *, shapes: dict[str, tuple[int, ...]] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A one-layer Llama of width 8 with a byte-level BPE tokenizer, in float32 (≈ 4 KB)."""
    shapes = shapes or {}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    square, ffn = (HIDDEN, HIDDEN), (FFN, HIDDEN)
    layer = {"attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,), "attn_q": square, "attn_k": square, "attn_v": square,
             "attn_output": square, "ffn_gate": ffn, "ffn_up": ffn, "ffn_down": (HIDDEN, FFN)}
    tensors = {"token_embd.weight": (len(TOKENS), HIDDEN),
               **{f"blk.0.{name}.weight": shape for name, shape in layer.items()},
               "output_norm.weight": (HIDDEN,), "output.weight": (len(TOKENS), HIDDEN)}
    rng = np.random.default_rng(0)
    for name, shape in tensors.items():
        if name not in drop:
            writer.add_tensor(name, (rng.standard_normal(shapes.get(name, shape)) * 0.1).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Converted GGUF folders go to a cache of this test's own; nothing reaches for the hub."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


@pytest.fixture(scope="module")
def whole_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# ----------------------------------------------------------------------------- GGUF
def test_the_whole_tiny_gguf_file_loads_with_its_tokenizer(whole_gguf: Path) -> None:
    model, tokenizer = load_causal_lm(str(whole_gguf), LoadOptions())
    assert model.config.hidden_size == HIDDEN and tokenizer is not None
    assert tokenizer("ab c")["input_ids"] == [TOKENS.index("ab"), TOKENS.index("c")]


@pytest.mark.parametrize("content, words", [
    (b"", "is not a GGUF file (it does not start with the GGUF magic bytes)"),
    (b"not gguf\n", "is not a GGUF file (it does not start with the GGUF magic bytes)"),
    (b"GGUF" + struct.pack("<I", 3) + b"junk" * 5, "is truncated or damaged: its header"),
    (b"GGUF" + struct.pack("<I", 1) + bytes(16), "is GGUF version 1; versions 2 and 3 can be read"),
])
def test_a_file_that_is_not_gguf_is_one_clear_error(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(DraftwiseError) as caught:
        gguf_folder(path)
    assert words in _one_line(caught.value)


def test_every_cut_of_a_gguf_file_is_one_clear_error(whole_gguf: Path, tmp_path: Path, home: Path) -> None:
    data = whole_gguf.read_bytes()
    reader = gguf.GGUFReader(str(whole_gguf))
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)  # past it: only alignment padding
    cut_file = tmp_path / "cut.gguf"
    for cut in range(0, end, 5):
        cut_file.write_bytes(data[:cut])
        with pytest.raises(DraftwiseError) as caught:
            gguf_folder(cut_file)
        assert any(w in _one_line(caught.value) for w in ("is truncated", "is not a GGUF file")), (cut, caught.value)
    assert not (home / "gguf").exists() or not any((home / "gguf").iterdir())  # no half-converted folder left


def test_random_damage_to_the_tensor_table_is_a_clear_error_or_a_model(whole_gguf: Path, tmp_path: Path) -> None:
    """Bytes of the tensor table (names, dimensions, types, offsets) flipped at random: the file either still
    describes a model that loads, or is refused in one line."""
    data = whole_gguf.read_bytes()
    reader = gguf.GGUFReader(str(whole_gguf))
    table = range(int(reader.tensors[0].field.offset), int(reader.data_offset))
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(24):
        damaged = bytearray(data)
        for at in rng.sample(table, rng.randint(1, 3)):
            damaged[at] ^= 1 << rng.randrange(8)
        path = tmp_path / f"damaged-{case}.gguf"
        path.write_bytes(bytes(damaged))
        try:
            load_causal_lm(str(path), LoadOptions())
            outcomes["loaded"] += 1
        except DraftwiseError as error:
            _one_line(error)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0, outcomes


@pytest.mark.parametrize("change, words", [
    ({"shapes": {"token_embd.weight": (len(TOKENS), HIDDEN + 1)}},
     "its weights do not fit its config (1 tensor; model.embed_tokens.weight is [7, 9] in the checkpoint, [7, 8]"),
    ({"shapes": {"blk.0.ffn_up.weight": (FFN - 4, HIDDEN)}}, "model.layers.0.mlp.up_proj.weight is [12, 8]"),
    ({"drop": ("output_norm.weight",)}, "its checkpoint lacks 1 of the weights its config needs (model.norm.weight)"),
])
def test_gguf_tensors_that_do_not_fit_the_model_are_one_clear_error(tmp_path: Path, change: dict[str, Any],
                                                                    words: str) -> None:
    path = write_gguf(tmp_path / "wrong.gguf", **change)
    with pytest.raises(DraftwiseError) as caught:
        load_causal_lm(str(path), LoadOptions())
    assert words in _one_line(caught.value)


def test_the_command_line_on_a_bad_gguf_file_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """The real process: `echo "not gguf" > x.gguf; draftwise generate --target x.gguf Hi`."""
    path = tmp_path / "x.gguf"
    path.write_text("not gguf\n")
    done = subprocess.run([sys.executable, "-m", "draftwise.cli", "generate", "--max-new-tokens", "8", "--target",
                           str(path), "Hi"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"draftwise generate: error: {path} is not a GGUF file (it does not start with the GGUF magic bytes); pass "
        "a .gguf model file, a Hugging Face folder or a hub id"]


# ----------------------------------------------------------------------------- safetensors folders
def _safetensors_tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _save_tensors(folder: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _half(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _resized(folder: Path) -> None:
    import torch

    tensors = _safetensors_tensors(folder)
    key = next(k for k in sorted(tensors) if k.endswith("mlp.up_proj.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0] // 2, tensors[key].shape[1])
    _save_tensors(folder, tensors)


def _dropped(folder: Path) -> None:
    tensors = _safetensors_tensors(folder)
    del tensors["model.norm.weight"]
    _save_tensors(folder, tensors)


DAMAGE = {
    "cut in half": (_half, "its safetensors weights are damaged or cut short"),
    "not safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"not safetensors" * 8),
                        "its safetensors weights are damaged or cut short"),
    "empty weights": (lambda f: (f / "model.safetensors").write_bytes(b""),
                      "its safetensors weights are damaged or cut short"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "no file named model.safetensors"),
    "config of another width": (lambda f: _config(f, hidden_size=64, head_dim=16),
                                "its weights do not fit its config ("),
    "config that cannot be": (lambda f: _config(f, hidden_size=30),
                              "is not a multiple of the number of attention heads"),
    "config not json": (lambda f: (f / "config.json").write_text("{ not json"), "is not a valid JSON file"),
    "a tensor resized": (_resized, "its weights do not fit its config (1 tensor; model.layers."),
    "a tensor missing": (_dropped, "its checkpoint lacks 1 of the weights its config needs (model.norm.weight)"),
    "tokenizer damaged": (lambda f: (f / "tokenizer.json").write_text("{ nope"),
                          "cannot load the tokenizer of model"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_folder_is_one_clear_error(tiny_models, tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["llama-target"], folder)
    spoil, words = DAMAGE[damage]
    spoil(folder)
    with pytest.raises(DraftwiseError) as caught:
        load_causal_lm(str(folder), LoadOptions())
    assert words in _one_line(caught.value)


@pytest.mark.parametrize("damage", ["cut in half", "a tensor resized", "tokenizer damaged"])
def test_the_command_line_on_a_damaged_folder_prints_one_line_and_exits_2(tiny_models, tmp_path: Path, capsys,
                                                                           damage: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["llama-target"], folder)
    DAMAGE[damage][0](folder)
    code = main(["generate", "--target", str(folder), "--max-new-tokens", "2", "the cat"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and DAMAGE[damage][1] in err, err


def test_a_folder_without_tokenizer_files_loads_for_token_ids_only(tiny_models, tmp_path: Path, capsys,
                                                                   caplog) -> None:
    """Today's documented behaviour: such a model takes and returns token ids; text is refused in one line."""
    from draftwise import Generator

    folder = tmp_path / "model"
    shutil.copytree(tiny_models["llama-target"], folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    caplog.set_level("INFO", logger="draftwise.models.loading")
    gen = Generator.from_pretrained(str(folder), [], policy="fixed")
    assert gen.tokenizer is None and "has no tokenizer files: it takes and returns token ids only" in caplog.text
    assert gen.generate([3, 4, 5], max_new_tokens=3, ignore_eos=True).token_ids
    with pytest.raises(DraftwiseError, match="this target has no tokenizer: pass token ids instead of text"):
        gen.generate("the cat", max_new_tokens=3)
    code = main(["generate", "--target", str(folder), "--max-new-tokens", "2", "the cat"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "draftwise generate: error: this target has no tokenizer: pass token ids instead of text"], err
