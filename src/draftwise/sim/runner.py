"""Run policies on a scenario's synthetic queries and measure them against the best fixed drafter.

Per seed: draw the queries once (lengths, domains, γ, the uniforms) and replay them for every
policy and every fixed drafter (common random numbers). Per policy and seed:

* ``mat`` — tokens / rounds over all queries (tokens per target forward);
* ``target_calls`` — mean rounds per query;
* ``regret`` — stopping-time regret: mean over queries of rounds(policy) − rounds(oracle arm),
  the oracle arm being the best fixed drafter of the query's domain in hindsight (the one with the
  highest pooled MAT on that domain's queries of the seed);
* ``best_arm_ratio`` — share of rounds that played the true best drafter of the domain at the
  round's position (``best_arm_ratio_50``: the same over each query's first 50 rounds);
* ``speedup`` — B target forwards (plain decoding) / simulated cost (see ``scenarios``).

Across seeds: the mean, and the standard deviation as ``*_std``.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies import make_policy
from draftwise.policies.base import Policy
from draftwise.sim.process import draw_gammas, fixed_arm_rounds, next_failure, response_lengths
from draftwise.sim.scenarios import Scenario
from draftwise.trace import RoundRecord

log = logging.getLogger(__name__)

METRICS = ("mat", "target_calls", "regret", "best_arm_ratio", "best_arm_ratio_50", "speedup")


@dataclass
class Query:
    """One synthetic response: everything a policy's run depends on, drawn before any policy runs."""

    kind: int  # index into scenario.query_types
    tokens: int  # B
    domain: np.ndarray  # (B + L + 1,) domain of each position
    gammas: np.ndarray  # (B + L + 1, arms) acceptance probability of every drafter at every position
    uniforms: np.ndarray  # (B + L + 1,) a draft token at position t is accepted iff U_t < γ_t


@dataclass
class QueryResult:
    rounds: int
    tokens: int
    cost: float  # in target forwards
    best_hits: int
    rounds_50: int
    best_hits_50: int


def draw_queries(scenario: Scenario, seed: int, queries: int, tokens: int | None, median: float | None) -> list[Query]:
    """The seed's queries: balanced over query types, lengths log-normal (or all ``tokens``)."""
    rng = np.random.default_rng([seed, 0x51])
    n_types = len(scenario.query_types)
    kinds = rng.permutation(np.arange(queries) % n_types)
    if tokens is not None:
        lengths = np.full(queries, tokens)
    else:
        lengths = response_lengths(queries, median or scenario.median_tokens, scenario.sigma,
                                   scenario.max_tokens, scenario.min_tokens, rng)
    out = []
    for kind, length in zip(kinds, lengths):
        size = int(length) + scenario.max_draft + 1
        segments = scenario.query_types[int(kind)]
        # each domain of the query covers an equal share of the response (a switch mid-response)
        domain = np.array(segments)[np.minimum(np.arange(size) * len(segments) // int(length), len(segments) - 1)]
        alpha = scenario.alpha[:, domain].T  # (positions, arms)
        out.append(Query(int(kind), int(length), domain, draw_gammas(alpha, scenario.kappa, scenario.rho, rng),
                         rng.random(size)))
    return out


def fixed_rounds(scenario: Scenario, query: Query) -> np.ndarray:
    """Rounds each fixed drafter needs on ``query`` (same γ and uniforms as the policies see)."""
    failure = next_failure(query.uniforms[:, None] < query.gammas)
    return np.array([fixed_arm_rounds(failure[:, i], query.tokens, scenario.max_draft)
                     for i in range(len(scenario.arms))])


def run_query(policy: Policy, scenario: Scenario, query: Query) -> QueryResult:
    """One query: select → draft (L tokens) → verify against the latent γ → feedback, until B tokens."""
    L, B = scenario.max_draft, query.tokens
    best = scenario.best_arm()[query.domain]
    full = policy.needs.full_information
    n_arms = len(scenario.arms)
    eval_cost = 0.0
    if full and n_arms > 1:
        eval_cost = scenario.eval_cost * (1 if scenario.eval_parallel else n_arms - 1)
    policy.begin_query()
    t = rounds = hits = hits_50 = 0
    cost = 0.0
    previous = -1
    while t < B:
        arm = policy.select()
        window = query.gammas[t : t + L, arm]
        ok = query.uniforms[t : t + L] < window
        accepted = L if ok.all() else int(np.argmin(ok))  # leading run of accepted draft tokens
        emitted = min(accepted + 1, B - t)
        accepted = min(accepted, emitted)
        # cost of the round in target forwards: drafting, a catch-up when a bandit switches drafters,
        # one verification forward, and (full information) evaluating the other drafters
        switch = scenario.switch_cost if (not full and previous not in (-1, arm)) else 0.0
        draft = L * scenario.draft_cost + switch
        cost += draft + 1.0 + eval_cost
        record = RoundRecord(
            index=rounds, arm=arm, arm_name=scenario.arms[arm], max_draft=L, drafted=L, accepted=accepted,
            emitted=emitted, position=t, accept_probs=window.tolist(),
            counterfactual=query.gammas[t : t + emitted].T.tolist() if full else None,
            draft_s=draft * scenario.target_s, verify_s=scenario.target_s, eval_s=eval_cost * scenario.target_s,
        )
        record.reward = policy.update(arm, record)
        hit = int(arm == best[t])
        hits += hit
        if rounds < 50:
            hits_50 += hit
        rounds += 1
        t += emitted
        previous = arm
    return QueryResult(rounds, B, cost, hits, min(rounds, 50), hits_50)


def policy_seed(seed: int, spec: str) -> np.random.Generator:
    """The policy's own generator: depends on the seed and the spec, not on the order of policies."""
    return np.random.default_rng([seed, zlib.crc32(spec.encode())])


def simulate(
    scenario: Scenario,
    policies: Sequence[str] | None = None,
    seeds: int = 10,
    queries: int | None = None,
    tokens: int | None = None,
    median_tokens: float | None = None,
    first_seed: int = 0,
) -> dict[str, Any]:
    """Run every policy on ``seeds`` seeds of the scenario; returns the result document (see cli)."""
    specs = list(policies or scenario.policies)
    if seeds < 1:
        raise DraftwiseError(f"--seeds must be >= 1, got {seeds}")
    if tokens is not None and tokens < 1:
        raise DraftwiseError(f"--tokens must be >= 1, got {tokens}")
    n_queries = queries or scenario.queries
    per_seed: dict[str, list[dict[str, float]]] = {spec: [] for spec in specs}
    oracle_mat: list[float] = []
    for seed in range(first_seed, first_seed + seeds):
        batch = draw_queries(scenario, seed, n_queries, tokens, median_tokens)
        fixed = np.array([fixed_rounds(scenario, q) for q in batch])  # (queries, arms)
        kinds = np.array([q.kind for q in batch])
        lengths = np.array([q.tokens for q in batch])
        oracle = np.zeros(len(batch), dtype=int)  # best fixed arm of each query's type, in hindsight
        for kind in np.unique(kinds):
            mask = kinds == kind
            oracle[mask] = int(np.argmin(fixed[mask].sum(axis=0)))  # same tokens: fewest rounds = best MAT
        oracle_rounds = fixed[np.arange(len(batch)), oracle]
        oracle_mat.append(lengths.sum() / oracle_rounds.sum())
        for spec in specs:
            policy = make_policy(spec, list(scenario.arms), policy_seed(seed, spec))
            results = [run_query(policy, scenario, q) for q in batch]
            rounds = np.array([r.rounds for r in results])
            per_seed[spec].append({
                "mat": lengths.sum() / rounds.sum(),
                "target_calls": float(rounds.mean()),
                "regret": float((rounds - oracle_rounds).mean()),
                "best_arm_ratio": sum(r.best_hits for r in results) / rounds.sum(),
                "best_arm_ratio_50": sum(r.best_hits_50 for r in results) / sum(r.rounds_50 for r in results),
                "speedup": lengths.sum() / sum(r.cost for r in results),
            })
        log.info("seed %d done", seed)
    return {
        "scenario": scenario.name,
        "seeds": seeds,
        "queries": n_queries,
        "tokens": tokens if tokens is not None else {"median": median_tokens or scenario.median_tokens,
                                                     "sigma": scenario.sigma, "max": scenario.max_tokens},
        "oracle": {"mat": float(np.mean(oracle_mat)), "mat_std": _std(oracle_mat)},
        "policies": {spec: _summarise(rows) for spec, rows in per_seed.items()},
    }


def _summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in METRICS:
        values = [row[key] for row in rows]
        out[key] = float(np.mean(values))
        out[f"{key}_std"] = _std(values)
    return out


def _std(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
