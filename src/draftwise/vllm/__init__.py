"""draftwise inside vLLM: the adaptive drafter pool as a speculative proposer.

Serve with ``speculative_config={"method": "custom_class", "model": "draftwise.vllm.Proposer",
"num_speculative_tokens": 8}``; draftwise's own options go in ``$DRAFTWISE_VLLM_CONFIG``
(:mod:`draftwise.vllm.options`). Nothing here imports vLLM.
"""

from draftwise.vllm.options import ENV_VAR, ProposerOptions, load_options
from draftwise.vllm.proposer import Proposer

__all__ = ["ENV_VAR", "Proposer", "ProposerOptions", "load_options"]
