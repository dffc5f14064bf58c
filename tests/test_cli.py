"""The CLI: JSON schema, trace export, help texts, one clear error per bad input, Ctrl-C."""

from __future__ import annotations

import json

import pytest

from draftwise.cli import main

STATS_KEYS = {"new_tokens", "rounds", "target_calls", "mat", "acceptance_rate", "tokens_per_s", "wall_s", "pulls"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_and_trace(tiny_models, capsys, tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    code, out, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]),
                          "--drafter", str(tiny_models["llama-near"]), "--drafter", "pld", "--policy", "ucb",
                          "--max-new-tokens", "12", "--ignore-eos", "--json", "--trace", str(trace), "the cat sat")
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == {"text", "token_ids", "stats"}
    assert set(obj["stats"]) >= STATS_KEYS
    assert obj["stats"]["new_tokens"] == len(obj["token_ids"]) == 12
    assert sum(obj["stats"]["pulls"].values()) == obj["stats"]["rounds"]
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows) == obj["stats"]["rounds"]
    assert {"arm", "drafted", "accepted", "accept_probs", "reward", "draft_s", "verify_s"} <= set(rows[0])


def test_prompt_from_stdin(tiny_models, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("the dog ran"))
    code, out, _ = _run(capsys, "generate", "--target", str(tiny_models["gpt2-target"]), "--max-new-tokens", "3",
                        "--json")
    assert code == 0 and json.loads(out)["stats"]["new_tokens"] <= 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--target", "/nonexistent/model"], "does not exist"),
        (["--drafter", "@othervocab"], "vocabulary of"),
        (["--drafter", "nosuchdrafter"], "unknown drafter 'nosuchdrafter'; valid:"),
        (["--policy", "nosuchpolicy"], "unknown policy 'nosuchpolicy'; valid:"),
        (["--policy", "ucb:gamma=2"], "unknown option 'gamma'"),
        (["--max-new-tokens", "0"], "max_new_tokens must be a positive integer"),
        (["--max-new-tokens", "400"], "exceeds the target's context of 256"),
        (["--temperature", "-0.5"], "temperature must be ≥ 0"),
        (["--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--top-p", "0"], "top_p must lie in (0, 1]"),
        (["--draft-len", "0"], "draft_len must be ≥ 1"),
        (["--drafter", "pld:max_ngram=0"], "max_ngram must be ≥ 1"),
    ],
)
def test_bad_input_gets_one_clear_error(tiny_models, capsys, extra, message) -> None:
    argv = ["generate", "--target", str(tiny_models["llama-target"])]
    extra = [str(tiny_models["llama-othervocab"]) if e == "@othervocab" else e for e in extra]
    code, _, err = _run(capsys, *argv, *extra, "the cat")
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_empty_prompt(tiny_models, capsys) -> None:
    code, _, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "  ")
    assert code == 2 and "prompt is empty" in err


def test_truncate_keeps_the_prompt_tail(tiny_models, capsys, caplog) -> None:
    long_prompt = " ".join(["the cat sat"] * 90)  # 270 tokens > 256
    code, out, err = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--truncate",
                          "--max-new-tokens", "6", "--ignore-eos", "--json", long_prompt)
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert stats["new_tokens"] == 6
    assert stats["prompt_tokens_cut"] == 270 - (256 - 6)  # what the context leaves for the prompt, no more
    assert "20 of its 270 tokens cut from the start of its text" in caplog.text


def test_truncate_cuts_the_text_and_keeps_the_chat_template() -> None:
    """A prompt far over the context: the start of the user's text goes, the chat template's header and the
    assistant's turn stay, and the result says how many tokens were cut."""
    from draftwise import Generator

    gen = Generator.from_pretrained("zoo:target", drafters=["pld"])
    question = "What is 2 + 2?"
    text = " ".join(f"item{i}" for i in range(320)) + " " + question
    full = gen.encode(text)
    assert gen.max_context is not None and len(full) > gen.max_context
    result = gen.generate(text, max_new_tokens=8, truncate=True)
    kept = gen.tokenizer.decode(result.prompt_ids)
    assert kept.startswith("<|user|>\n") and kept.endswith(f"{question}\n<|assistant|>\n"), kept[:40] + kept[-40:]
    assert "item0 " not in kept and "item319" in kept
    assert len(result.prompt_ids) + 8 <= gen.max_context
    assert result.stats.prompt_tokens_cut == len(full) - len(result.prompt_ids) > 0
    session = gen.batch_session(2)
    handle = session.add(text, max_new_tokens=8, truncate=True)
    session.run()
    assert handle.result is not None and handle.result.prompt_ids == result.prompt_ids
    assert handle.result.stats.prompt_tokens_cut == result.stats.prompt_tokens_cut
    assert gen.generate(full, max_new_tokens=8, truncate=True).prompt_ids == full[-(gen.max_context - 8):]


def test_help_explains_every_option(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    for option in ("--target", "--drafter", "--policy", "--max-new-tokens", "--temperature", "--top-p", "--seed",
                   "--draft-len", "--json", "--trace"):
        assert option in text


def test_ctrl_c_returns_what_was_generated(tiny_models, capsys, monkeypatch) -> None:
    """Ctrl-C mid-generation: the text so far and its statistics are printed, exit code 130."""
    from draftwise.drafters.prompt_lookup import PromptLookupDrafter

    calls = {"n": 0}
    original = PromptLookupDrafter.propose

    def interrupt_on_fifth_round(self, context, max_len, ctx, stop=None):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, context, max_len, ctx, stop)

    monkeypatch.setattr(PromptLookupDrafter, "propose", interrupt_on_fifth_round)
    # a fixed policy: PLD is asked exactly once per round (the default also asks whether it matches)
    code, out, _ = _run(capsys, "generate", "--target", str(tiny_models["llama-target"]), "--drafter", "pld",
                          "--policy", "fixed:0", "--max-new-tokens", "50", "--ignore-eos", "--json",
                          "the cat sat on the mat")
    assert code == 130
    obj = json.loads(out)
    assert obj["stats"]["stopped_by"] == "interrupted"
    assert obj["stats"]["rounds"] == 4 and 4 <= obj["stats"]["new_tokens"] == len(obj["token_ids"]) < 50
