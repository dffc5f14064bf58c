"""Delayed full-information feedback: QFI-D's FIFO and HedgeSpec's token-level game.

HedgeSpec §3.3 / §B.1: the loss of starting a draft at token t is known only once the verified
trajectory reaches t + K − 1 (acceptance-length loss), so loss vectors are *revealed* late.
QFI-D (Joulani et al. 2013, Alg. 2, instantiated in HedgeSpec §B.1) keeps a FIFO of revealed
loss vectors and feeds all of them to the base learner before each decision; the base learner
never sees a loss before it is revealed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.feedback import length_loss


class DelayedFeedback:
    """A FIFO of loss vectors, each released no earlier than the round at which it is revealed.

    >>> queue = DelayedFeedback()
    >>> queue.push(np.array([0.1, 0.9]), available_at=2)
    >>> list(queue.release(now=1)), len(list(queue.release(now=2)))
    ([], 1)
    """

    def __init__(self) -> None:
        self._pending: deque[tuple[int, np.ndarray]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, losses: np.ndarray, available_at: int) -> None:
        """Queue ``losses``, usable from round ``available_at`` on (arrival order is kept)."""
        self._pending.append((available_at, np.asarray(losses, dtype=float)))

    def release(self, now: int) -> Iterator[np.ndarray]:
        """Yield, in arrival order, every queued vector revealed by round ``now``; keep the rest."""
        keep: deque[tuple[int, np.ndarray]] = deque()
        while self._pending:
            available_at, losses = self._pending.popleft()
            if available_at <= now:
                yield losses
            else:
                keep.append((available_at, losses))
        self._pending = keep


class TokenGame:
    """HedgeSpec's token-level game (Fig. 4): one loss vector per verified token position.

    ``add(gammas)`` appends one round's counterfactual acceptance probabilities (arms × verified
    positions) and returns the loss vectors that became computable: f_t = 1 − γ_t for the first
    ``switch`` positions when ``kind="hybrid"`` (HedgeSpec §B.5) or always for ``"accept"``, and
    the Theorem 3 length loss over γ_t..γ_{t+K−1} otherwise — available only once position
    t + K − 1 is verified (the delay). Positions whose window is never completed before the
    response ends give no loss.
    """

    def __init__(self, n_arms: int, depth: int, kind: str = "length", switch: int = 3) -> None:
        if kind not in ("accept", "length", "hybrid"):
            raise DraftwiseError(f"token game loss must be accept, length or hybrid, got {kind!r}")
        if depth < 1:
            raise DraftwiseError(f"token game needs a draft depth K >= 1, got {depth}")
        self.depth = depth
        self.kind = kind
        self.switch = switch
        self._gammas = np.zeros((n_arms, 64))  # capacity doubles as the response grows
        self.frontier = 0  # verified positions so far
        self.next_position = 0  # first position whose loss has not been emitted yet

    def add(self, gammas: np.ndarray) -> list[np.ndarray]:
        gammas = np.asarray(gammas, dtype=float)
        if gammas.ndim != 2 or gammas.shape[0] != self._gammas.shape[0]:
            raise DraftwiseError(
                f"counterfactual must be (arms={self._gammas.shape[0]}, positions), got {gammas.shape}")
        end = self.frontier + gammas.shape[1]
        if end > self._gammas.shape[1]:
            grown = np.zeros((self._gammas.shape[0], max(end, 2 * self._gammas.shape[1])))
            grown[:, : self.frontier] = self._gammas[:, : self.frontier]
            self._gammas = grown
        self._gammas[:, self.frontier : end] = gammas
        self.frontier = end
        # positions whose loss is now computable: acceptance losses at once, length losses once
        # their K-token window is verified
        first = self.next_position
        if self.kind == "accept":
            accept_until = self.frontier
        elif self.kind == "hybrid":
            accept_until = min(self.switch, self.frontier)
        else:
            accept_until = 0
        accept_until = max(accept_until, first)
        length_until = max(self.frontier - self.depth + 1, accept_until) if self.kind != "accept" else accept_until
        out: list[np.ndarray] = []
        if accept_until > first:
            out.extend(1.0 - self._gammas[:, first:accept_until].T)
        if length_until > accept_until:
            windows = np.lib.stride_tricks.sliding_window_view(
                self._gammas[:, accept_until : length_until + self.depth - 1], self.depth, axis=1
            )  # (arms, positions, K)
            out.extend(length_loss(windows).T)
        self.next_position = length_until
        return out
