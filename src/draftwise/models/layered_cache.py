"""The transformers ``Cache`` surface a decoder forward touches, over one object per layer: the base
of draftwise's own KV caches (a batch's rows, an exact target's padded keys)."""

from __future__ import annotations

from typing import Any

import torch


def decoder_layers(model: Any) -> int:
    """How many decoder layers (each with its own keys and values) ``model``'s text config declares."""
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(config.num_hidden_layers)


class LayeredCache:
    """Each call goes to the layer it names; ``layers`` (objects with ``update``, ``get_seq_length`` and
    ``get_mask_sizes``) is set by the subclass."""

    is_compileable = False
    layers: list[Any]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.layers[layer_idx].get_seq_length())

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        sizes: tuple[int, int] = self.layers[layer_idx].get_mask_sizes(query_length)
        return sizes

    def __len__(self) -> int:
        return len(self.layers)
