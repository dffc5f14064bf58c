"""Training rows cut from the bulk signal's chunks (:mod:`draftwise.training.signal`).

Each chunk's sequences, one after another, are cut into windows of ``seq_len`` tokens (EAGLE trains
on packed conversations); a window's arrays are read from the memory-mapped chunk when a batch
asks for it, so millions of tokens of features train in a few hundred megabytes of memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftwise.errors import DraftwiseError


@dataclass(frozen=True)
class RowBatch:
    tokens: torch.Tensor  # (B, T) long, target ids
    features: torch.Tensor  # (B, T, L, H) float32: the held layers asked for
    top_ids: torch.Tensor  # (B, T, k) long, target ids
    top_logprobs: torch.Tensor  # (B, T, k) float32
    learn: torch.Tensor  # (B, T) bool: the next token is one to learn (within the sequence; a response's, if asked)


def signal_chunks(root: Path, sources: tuple[str, ...], domains: tuple[str, ...]) -> list[Path]:
    chunks = [c for s in sources for d in domains for c in sorted((root / s / d).glob("[0-9]*"))]
    if not chunks:
        raise DraftwiseError(f"no signal chunks under {root} for sources {sources} and domains {domains}")
    return chunks


def held_layers(root: Path) -> tuple[int, ...]:
    return tuple(json.loads((root / "signal.json").read_text())["plan"]["layers"])


class SignalRows:
    """Windows of ``seq_len`` over ``chunks``; ``layers``: which held layers a batch carries."""

    def __init__(self, chunks: list[Path], seq_len: int, held: tuple[int, ...], layers: tuple[int, ...],
                 responses_only: bool = False) -> None:
        missing = [layer for layer in layers if layer not in held]
        if missing:
            raise DraftwiseError(f"the signal holds layers {held}, not {missing}")
        self.chunks = chunks
        self.seq_len = seq_len
        self.columns = [held.index(layer) for layer in layers]
        self.responses_only = responses_only
        self._arrays: dict[int, dict[str, np.ndarray]] = {}
        windows = []
        for c, chunk in enumerate(chunks):
            n = int(np.load(chunk / "starts.npy")[-1])
            windows += [(c, offset) for offset in range(0, n - seq_len + 1, seq_len)]
        self.windows = np.asarray(windows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.windows)

    def tokens(self) -> int:
        return len(self) * self.seq_len

    def arrays(self, c: int) -> dict[str, np.ndarray]:
        if c not in self._arrays:
            chunk = self.chunks[c]
            arrays = {name: np.load(chunk / f"{name}.npy", mmap_mode="r")
                      for name in ("tokens", "features", "top_ids", "top_logprobs")}
            arrays["learn"] = learn_mask(np.load(chunk / "starts.npy"), np.load(chunk / "prompt_lens.npy"),
                                         self.responses_only)
            self._arrays[c] = arrays
        return self._arrays[c]

    def batch(self, index: np.ndarray) -> RowBatch:
        windows = [(self.arrays(int(c)), slice(int(o), int(o) + self.seq_len)) for c, o in self.windows[index]]

        def stacked(name: str) -> torch.Tensor:
            return torch.from_numpy(np.stack([arrays[name][window] for arrays, window in windows]))

        features = (torch.from_numpy(np.stack([arrays["features"][window][:, self.columns]
                                               for arrays, window in windows])).float()
                    if self.columns else torch.empty(0))  # no layers asked: no features read
        return RowBatch(stacked("tokens").long(), features, stacked("top_ids").long(),
                        stacked("top_logprobs").float(), stacked("learn"))


def learn_mask(starts: np.ndarray, prompt_lens: np.ndarray, responses_only: bool) -> np.ndarray:
    """(N,) True at positions whose next token belongs to the same sequence (and, with
    ``responses_only``, to its response: what a drafter is asked to write)."""
    learn = np.zeros(int(starts[-1]), dtype=bool)
    for start, stop, prompt in zip(starts[:-1], starts[1:], prompt_lens):
        first = start + (prompt - 1 if responses_only else 0)
        learn[first : stop - 1] = True
    return learn
