"""``draftwise.vllm.Proposer``: the class vLLM loads with ``method: "custom_class"``.

vLLM (0.32) imports the class named by ``speculative_config["model"]``, builds it with the
``VllmConfig`` and, every step, calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)``: one list of draft tokens per row back (empty = no
speculation for that request this step). Everything else lives in :mod:`draftwise.vllm.core`;
this file only reads vLLM's config and the calling frame. It imports nothing from vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.vllm.batch_view import caller_view
from draftwise.vllm.core import EngineFacts, ProposerCore
from draftwise.vllm.options import ENV_VAR, ProposerOptions, load_options

log = logging.getLogger("draftwise.vllm")


def engine_facts(vllm_config: Any) -> EngineFacts:
    """Draft cap, context limit, vocabulary and end-of-sequence ids from vLLM's config."""
    spec = vllm_config.speculative_config
    model = vllm_config.model_config
    eos = getattr(model.hf_config, "eos_token_id", None)
    eos_ids = frozenset(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
    return EngineFacts(
        num_speculative_tokens=int(spec.num_speculative_tokens),
        max_model_len=int(model.max_model_len),
        vocab_size=int(model.get_vocab_size()),
        eos_ids=frozenset(int(e) for e in eos_ids),
    )


def adopt_vllm_logging() -> None:
    """Show draftwise's INFO lines where vLLM shows its own (vLLM configures only its logger)."""
    ours, theirs = logging.getLogger("draftwise"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO if theirs.level in (logging.NOTSET, logging.DEBUG) else theirs.level)
    ours.propagate = False


class Proposer:
    """draftwise's adaptive drafter pool as a vLLM speculative proposer.

    Options come from ``$DRAFTWISE_VLLM_CONFIG`` (:mod:`draftwise.vllm.options`); a bad one raises
    here, when vLLM starts, with the option named.
    """

    def __init__(self, vllm_config: Any, options: ProposerOptions | None = None) -> None:
        adopt_vllm_logging()
        try:
            self.options = options if options is not None else load_options()
            self.core = ProposerCore(self.options, engine_facts(vllm_config))
        except DraftwiseError as exc:
            raise DraftwiseError(f"draftwise vLLM proposer ({ENV_VAR}): {exc}") from None
        log.info("draftwise proposer: mode=%s policy=%s drafters=%s arms=%s draft_len=%d",
                 self.options.mode, self.options.policy, ",".join(d.name for d in self.core.pool.templates),
                 ",".join(a.name for a in self.core.arms) or "lengths " + str(getattr(self.core, "lengths", "")),
                 self.core.draft_len)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hands the target model to drafters that share it; ours do not."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        view = caller_view(len(sampled_token_ids))
        return self.core.step(view, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
