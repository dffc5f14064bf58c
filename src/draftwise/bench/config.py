"""A bench run's settings: what ``draftwise bench`` parses its options into, frozen, recorded in env.json.

Light on purpose: the command line reads these defaults to build its parser without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftwise.models.defaults import DEFAULT_TARGET, ZOO_POOL
from draftwise.models.numerics_modes import AUTO
from draftwise.request import Request

DEFAULT_POOL = ZOO_POOL  # zoo:all: the zoo drafters of whichever target is benched
DEFAULT_METHODS = ("ar", "default", "fixed:*", "random", "policies:*", "router", "oracle", "hf-assisted:*", "hf-pld")
# Settings that change what a row means: a resumed run must match them exactly.
RUN_DEFINING = ("target", "drafters", "max_new_tokens", "temperature", "top_k", "top_p", "sampling", "draft_len",
                "seed", "turns", "dtype", "numerics", "device", "warmup_tokens")
# what runs recorded before a setting existed
LEGACY_SETTINGS = {"sampling": "rejection", "device": "cpu", "numerics": "native"}


@dataclass(frozen=True)
class BenchConfig:
    out: str
    data: tuple[str, ...] = ()  # prompt files and named sets (self_instruct, zoo:dev, zoo:test); () = zoo:dev
    methods: tuple[str, ...] = DEFAULT_METHODS
    target: str = DEFAULT_TARGET
    drafters: tuple[str, ...] = DEFAULT_POOL
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    sampling: str = "coupled"  # coupled | rejection (draftwise.verify.coupling); greedy runs ignore it
    repeats: int = 1
    draft_len: int | None = None  # None: the library's default (4), or a preset's own
    seed: int = 0
    turns: str = "first"
    per_domain: int | None = None  # prompts kept per domain of each --data source (zoo splits: default 8)
    zoo_corpus: str | None = None
    router_train: str | None = None
    warmup_tokens: int = 16  # one untimed run of this length per method and shard
    workers: int = 1
    ray: str | None = None
    threads: int = 1  # torch threads per worker
    dtype: str = "float32"
    numerics: str = AUTO  # how the target computes (draftwise.models.numerics)
    device: str = "cpu"  # torch device of every model (cuda, cuda:1, mps, ...)
    progress: bool = True

    def request(self) -> Request:
        """What every generation of the run asks for (its seed is set per prompt and repeat)."""
        return Request(self.max_new_tokens, self.temperature, self.top_k, self.top_p)
