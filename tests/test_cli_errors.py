"""Bad input found by trying the product as a demanding user: one clear line on stderr and exit 2
(never a traceback), checked before any work; closed pipes end a command quietly."""

from __future__ import annotations

import io
import json
import math
import socket
import subprocess
import sys
import time

import pytest

from draftwise.cli import main
from draftwise.cli.generate import usable_cpus
from draftwise.errors import DraftwiseError


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_clear_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ----------------------------------------------------------------------------- generate


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "nan"], "temperature must be ≥ 0 and finite (0 = greedy), got nan"),
    (["--temperature", "inf"], "temperature must be ≥ 0 and finite (0 = greedy), got inf"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2**64), got -1"),
    (["--seed", str(2**64)], f"--seed must be an integer in [0, 2**64), got {2**64}"),
    (["--top-p", "nan"], "top_p must lie in (0, 1], got nan"),
    (["--top-k", "0"], "top_k must be an integer ≥ 1, got 0"),
    (["--max-new-tokens", "-3"], "max_new_tokens must be a positive integer, got -3"),
    (["--trace", "/nonexistent-draftwise-dir/t.jsonl"], "--trace: folder /nonexistent-draftwise-dir does not exist"),
    (["--stop", ""], "stop strings must not be empty (an empty one matches at once), got ['']"),
    (["--stop", "\n", "--stop", ""], "stop strings must not be empty"),
    (["--threads", "0"], "--threads must lie in [1, "),
    (["--threads", "@too-many"], "(the CPUs this process may use), got "),
])
def test_generate_refuses_bad_numbers_and_paths_before_loading(tiny_models, capsys, monkeypatch, extra, message):
    import draftwise.api

    def no_loading(*args, **kwargs):
        raise AssertionError("the models were loaded before the input was checked")

    monkeypatch.setattr(draftwise.api.Generator, "from_pretrained", no_loading)
    extra = [str(usable_cpus() + 1) if e == "@too-many" else e for e in extra]
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), *extra, "the cat")
    _one_clear_error(code, err, message)


def test_threads_beyond_the_cpus_name_the_valid_range(tiny_models, capsys, monkeypatch):
    monkeypatch.setattr("draftwise.cli.generate.usable_cpus", lambda: 2)
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--threads", "1000", "cat")
    _one_clear_error(code, err, "--threads must lie in [1, 2] (the CPUs this process may use), got 1000")
    code, out, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--threads", "2",
                          "--max-new-tokens", "2", "--json", "the cat")
    assert code == 0, err
    assert json.loads(out)["stats"]["new_tokens"] <= 2


def test_a_nul_character_in_the_prompt_is_refused_before_loading(tiny_models, capsys, monkeypatch):
    import draftwise.api

    def no_loading(*args, **kwargs):
        raise AssertionError("the models were loaded before the prompt was checked")

    monkeypatch.setattr(draftwise.api.Generator, "from_pretrained", no_loading)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Hel\0lo")))  # printf 'Hel\0lo' | draftwise …
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]))
    _one_clear_error(code, err, "the prompt on stdin contains a NUL character (\\x00) at position 3")
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "the \0cat")
    _one_clear_error(code, err, "the prompt argument contains a NUL character (\\x00) at position 4")


def test_trace_into_a_folder_path_is_refused(tiny_models, capsys, tmp_path):
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--trace", str(tmp_path),
                        "the cat")
    _one_clear_error(code, err, "is a folder")


def test_non_utf8_stdin_and_argument(tiny_models, capsys, monkeypatch):
    target = str(tiny_models["llama-target"])
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe")))  # printf '\xff\xfe' | draftwise …
    code, _, err = _run(capsys, "generate", "--target", target)
    _one_clear_error(code, err, "stdin is not UTF-8 text (byte 0xff at offset 0)")
    # what Python makes of the argv bytes b"the \xff cat" (surrogateescape)
    argument = b"the \xff cat".decode("utf-8", "surrogateescape")
    code, _, err = _run(capsys, "generate", "--target", target, argument)
    _one_clear_error(code, err, "the prompt argument is not UTF-8 text (byte 0xff at offset 4)")


@pytest.fixture
def one_cuda_device(monkeypatch):
    """A machine whose only accelerator is one CUDA device (whatever this one has)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


@pytest.mark.parametrize("device, message", [
    ("meta", "device 'meta' cannot run models; valid: cpu, cuda, cuda:N, mps, xpu (available here: cpu, cuda)"),
    ("nonsense", "device 'nonsense' cannot run models; valid: cpu, cuda, cuda:N, mps, xpu (available here: cpu, "
                 "cuda)"),
    ("cuda:1", "device 'cuda:1' is not available here; valid here: cpu, cuda"),
    ("mps", "device 'mps' is not available here; valid here: cpu, cuda"),
])
def test_generate_refuses_an_unusable_device_before_loading(tiny_models, capsys, monkeypatch, one_cuda_device,
                                                           device, message):
    def no_loading(*args, **kwargs):
        raise AssertionError("the target was loaded before the device was checked")

    monkeypatch.setattr("draftwise.api.load_target", no_loading)
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--device", device,
                        "the cat")
    _one_clear_error(code, err, message)


def test_utf8_stdin_still_works(tiny_models, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("the cat — sat\r\n".encode())))
    code, out, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--max-new-tokens", "2",
                          "--json")
    assert code == 0, err
    assert json.loads(out)["stats"]["new_tokens"] <= 2


def test_library_refuses_bad_sampling_seeds_and_text(tiny_models):
    from draftwise import Generator

    gen = Generator.from_pretrained(str(tiny_models["llama-target"]), policy="fixed")
    for kwargs, message in [({"temperature": math.nan}, "temperature"), ({"temperature": math.inf}, "temperature"),
                            ({"top_p": math.nan}, "top_p"), ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
                            ({"max_new_tokens": 2.5}, "max_new_tokens")]:
        with pytest.raises(DraftwiseError, match=message):
            gen.generate("the cat", **kwargs)
    with pytest.raises(DraftwiseError, match="not valid Unicode text"):
        gen.generate("the \udcff cat")
    with pytest.raises(DraftwiseError, match="seed must be an integer"):
        Generator(gen.model, gen.tokenizer, [], policy="fixed", seed=-1)
    assert gen.generate("the cat", max_new_tokens=2, seed=2**64 - 1).stats.new_tokens <= 2  # the largest seed works


@pytest.fixture(scope="module")
def tiny_generator(tiny_models):
    from draftwise import Generator

    return Generator.from_pretrained(str(tiny_models["llama-target"]), ["pld"], policy="fixed")


@pytest.mark.parametrize("stop", ["", [""], ["\n", ""]])
def test_library_refuses_an_empty_stop_string_as_the_server_does(tiny_generator, stop):
    with pytest.raises(DraftwiseError, match="stop strings must not be empty"):
        tiny_generator.generate("the cat", max_new_tokens=4, stop=stop)
    with pytest.raises(DraftwiseError, match="stop strings must not be empty"):
        tiny_generator.batch_session(2).add("the cat", stop=stop)
    assert tiny_generator.generate("the cat", max_new_tokens=4, stop=["sat"]).stats.new_tokens <= 4


def test_library_refuses_a_nul_character_in_the_prompt(tiny_generator):
    with pytest.raises(DraftwiseError, match=r"the prompt contains a NUL character \(\\x00\) at position 3"):
        tiny_generator.generate("the\0 cat", max_new_tokens=2)


@pytest.mark.parametrize("keyword, words", [
    ("max_tokens", "unknown generation setting 'max_tokens'; did you mean max_new_tokens? valid: max_new_tokens, "
                   "temperature, top_k, top_p, seed, stop, ignore_eos, truncate"),
    ("temprature", "unknown generation setting 'temprature'; did you mean temperature?"),
    ("frobnicate", "unknown generation setting 'frobnicate'; valid: max_new_tokens,"),
])
def test_library_names_the_valid_keywords_for_an_unknown_one(tiny_generator, keyword, words):
    from draftwise import Request

    for call in (lambda: tiny_generator.generate("the cat", **{keyword: 8}),
                 lambda: tiny_generator.generate("the cat", Request(max_new_tokens=2), **{keyword: 8}),
                 lambda: tiny_generator.batch_session(2).add("the cat", **{keyword: 8})):
        with pytest.raises(DraftwiseError) as caught:
            call()
        assert words in str(caught.value)
    [result] = tiny_generator.generate_batch(["the cat"], **{keyword: 8})
    assert result.error is not None and words in result.error


@pytest.mark.parametrize("ids, words", [
    ([1.5, 2.0], "prompt token ids must be integers, got 1.5 at position 0"),
    ([3, 2.0], "prompt token ids must be integers, got 2.0 at position 1"),
    ([True, 2], "prompt token ids must be integers, got True at position 0"),
    (["3", 4], "prompt token ids must be integers, got '3' at position 0"),
])
def test_library_refuses_token_ids_that_are_not_integers(tiny_generator, ids, words):
    with pytest.raises(DraftwiseError) as caught:
        tiny_generator.generate(ids, max_new_tokens=2)
    assert words in str(caught.value)


def test_integer_token_ids_of_numpy_and_torch_still_work(tiny_generator):
    import numpy as np
    import torch

    reference = tiny_generator.generate([3, 4, 5], max_new_tokens=3, ignore_eos=True).token_ids
    for ids in (np.array([3, 4, 5]), torch.tensor([3, 4, 5]), [np.int64(3), 4, 5]):
        assert tiny_generator.generate(ids, max_new_tokens=3, ignore_eos=True).token_ids == reference


# ----------------------------------------------------------------------------- hub ids


def _closed_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed on leaving: nothing listens there


@pytest.mark.parametrize("setup", ["HF_HUB_OFFLINE", "unreachable endpoint"])
def test_an_unknown_hub_id_fails_at_once_when_the_hub_cannot_be_reached(capsys, monkeypatch, setup):
    """No retries for half a minute: one probe at most (to a closed loopback port here, never further), then
    the local Hugging Face cache only, and one line."""
    reached: list[tuple[str, int]] = []
    connect = socket.create_connection

    def loopback_only(address, *args, **kwargs):
        reached.append(address)
        assert address[0] == "127.0.0.1", f"a connection to {address} was tried"
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", loopback_only)
    port = _closed_loopback_port()
    if setup == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        reason = "HF_HUB_OFFLINE is set"
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        reason = f"the Hugging Face hub (127.0.0.1:{port}) cannot be reached"
    start = time.perf_counter()
    code, _, err = _run(capsys, "generate", "--target", "someorg/nonexistent-model", "--max-new-tokens", "8", "Hi")
    assert time.perf_counter() - start < 10
    _one_clear_error(code, err, "cannot load model 'someorg/nonexistent-model': it is not a local folder nor in the "
                     f"Hugging Face cache, and {reason}; pass a local folder or a .gguf file")
    assert reached == ([] if setup == "HF_HUB_OFFLINE" else [("127.0.0.1", port)])


# ----------------------------------------------------------------------------- sim


@pytest.mark.parametrize("extra, message", [
    (["--kappa", "nan"], "--kappa must be a finite number > 0, got nan"),
    (["--kappa", "inf"], "--kappa must be a finite number > 0, got inf"),
    (["--first-seed", "-1"], "--first-seed must be ≥ 0"),
    (["--queries", "0"], "--queries must be ≥ 1, got 0"),
    (["--median-tokens", "nan"], "--median-tokens must be a finite number > 0, got nan"),
    (["--median-tokens", "-5"], "--median-tokens must be a finite number > 0, got -5.0"),
    (["--rho", "nan"], "--rho must be in [0, 1), got nan"),
])
def test_sim_refuses_bad_numbers(capsys, extra, message):
    code, _, err = _run(capsys, "sim", "--scenario", "hedgespec-llama", "--seeds", "1", "--queries", "5", *extra)
    _one_clear_error(code, err, message)


# ----------------------------------------------------------------------------- zoo distill


@pytest.mark.parametrize("extra, message", [
    (["--head-steps", "0"], "--head-steps must be ≥ 1, got 0"),
    (["--head-lr", "nan"], "--head-lr must be a finite number > 0, got nan"),
    (["--head-lr=-1e-3"], "--head-lr must be a finite number > 0, got -0.001"),
])
def test_distill_refuses_a_bad_head_schedule_before_any_work(capsys, tmp_path, extra, message):
    code, _, err = _run(capsys, "zoo", "distill", "--out", str(tmp_path / "build"), *extra)
    _one_clear_error(code, err, message)
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize("only, name", [("bogus", "'bogus'"), ("code,bogus", "'bogus'"), ("code,", "''")])
def test_distill_refuses_an_unknown_only_drafter_before_writing_anything(capsys, tmp_path, only, name):
    log = tmp_path / "distill.log"
    code, _, err = _run(capsys, "zoo", "distill", "--target", "zoo:target", "--data", str(tmp_path),
                        "--out", str(tmp_path / "build"), "--log", str(log), "--only", only)
    _one_clear_error(code, err, f"--only: unknown drafter {name}; valid: generalist, code, math, sql, translation, "
                     "summarization, qa, eagle (comma-separated)")
    assert not (tmp_path / "build").exists() and not log.exists()


def test_distill_in_the_library_refuses_an_unknown_drafter_before_writing_anything(tmp_path):
    from draftwise.training.distill import run_distill

    with pytest.raises(DraftwiseError, match="only: unknown drafter 'bogus'; valid: generalist, code,"):
        run_distill("zoo:target", tmp_path, tmp_path / "build", only=["generalist", "bogus"])
    assert not (tmp_path / "build").exists()


# ----------------------------------------------------------------------------- zoo path


@pytest.mark.parametrize("name", ["", "  "])
def test_zoo_path_refuses_an_empty_name(capsys, name):
    code, out, err = _run(capsys, "zoo", "path", name)
    _one_clear_error(code, err, "the model name is empty; valid: smollm2, zoo:NAME (draftwise zoo list) or a .gguf "
                     "file")
    assert out == ""


# ----------------------------------------------------------------------------- closed pipes


@pytest.mark.parametrize("argv", [["sim", "--list"], ["policies"]])
def test_a_closed_pipe_ends_the_command_quietly(argv):
    """`draftwise sim --list | head -2`: the reader is gone before the command writes."""
    script = "import sys; from draftwise.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # closed before the child has started: its first write meets a closed pipe
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""
