"""One Generator shared by threads: each call gets the tokens it would get alone (calls take turns)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

PROMPTS = ["def square(x):", "class Stack:", "import numpy as np\n", "The capital of France is",
           "for i in range(10):", "SELECT name FROM"]


@pytest.fixture(scope="module")
def shared():
    from draftwise import Generator

    generator = Generator.from_pretrained("zoo:target", drafters=["pld", "suffix"])
    references = {p: generator.generate(p, max_new_tokens=10).token_ids for p in PROMPTS}
    return generator, references


def test_threads_calling_generate_on_one_generator_get_their_own_greedy_tokens(shared):
    generator, references = shared
    start = threading.Barrier(6)

    def ask(i: int) -> list[tuple[str, list[int]]]:
        start.wait()
        out = []
        for k in range(4):
            prompt = PROMPTS[(i + k) % len(PROMPTS)]
            out.append((prompt, generator.generate(prompt, max_new_tokens=10).token_ids))
        return out

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = [pair for batch in pool.map(ask, range(6)) for pair in batch]
    assert len(answers) == 24
    wrong = [(p, ids) for p, ids in answers if ids != references[p]]
    assert not wrong, wrong[:2]


def test_a_batch_session_stepped_by_one_thread_while_another_generates(shared):
    generator, references = shared
    session = generator.batch_session(4)
    handles = {p: session.add(p, max_new_tokens=10) for p in PROMPTS[:4]}
    solo: list[tuple[str, list[int]]] = []

    def generate_meanwhile() -> None:
        for prompt in PROMPTS[3:]:
            solo.append((prompt, generator.generate(prompt, max_new_tokens=10).token_ids))

    thread = threading.Thread(target=generate_meanwhile)
    thread.start()
    while session.pending:
        session.step()
    thread.join(120)
    assert {p: h.result.token_ids for p, h in handles.items()} == {p: references[p] for p in PROMPTS[:4]}
    assert solo == [(p, references[p]) for p in PROMPTS[3:]]
