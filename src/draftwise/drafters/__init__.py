"""Drafters and how a spec string becomes one.

Specs: ``pld``, ``pld:max_ngram=4``, ``suffix``, ``suffix:factor=2``, ``arctic-suffix`` (the
suffix method on Arctic Inference's C++ tries, when that package is installed), a model path or hub id
(an :class:`LMDrafter`), ``zoo:NAME`` or ``zoo:all`` (the embedded zoo's drafters),
``lm:model=PATH,name=NAME`` with optional draft-tree options ``tree=dynamic|static|sampled``,
``topk``, ``budget``, ``depth``, ``shape`` (e.g. ``lm:model=PATH,tree=dynamic,topk=4,budget=16``;
see :class:`~draftwise.drafters.draft_shapes.TreeOptions`). White-box heads that read the target's hidden
states: ``eagle:head=PATH``, ``medusa:head=PATH`` (same tree options, ``head`` may be a zoo name),
``zoo:eagle-NAME`` / ``zoo:medusa`` (zoo heads; ``zoo:heads`` = every zoo head, never part of
``zoo:all``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from draftwise.drafters import arctic_suffix, eagle, medusa  # noqa: F401  (register arctic-suffix, the head kinds)
from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter, ModelDrafter, SharedForwards
from draftwise.drafters.draft_shapes import TreeOptions, draft_chain, draft_tree
from draftwise.drafters.lm import LMDrafter
from draftwise.drafters.prompt_lookup import PromptLookupDrafter
from draftwise.drafters.retrieval import RetrievalDrafter  # registers `rest`
from draftwise.drafters.stopping import STOP_RULES, StopRule, make_stop_rule
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.drafters.whitebox import HEAD_KINDS, WhiteBoxDrafter, load_head_drafter
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm, resolve_model_path
from draftwise.models.vocab_map import attach_vocab_map, load_vocab_map, output_size
from draftwise.options import keyword_defaults, split_spec, typed_options
from draftwise.zoo import zoo_drafter_names, zoo_head_names, zoo_target_of
from draftwise.zoo.load import TOY_TARGET, zoo_domain_of

__all__ = ["DRAFTERS", "HEAD_KINDS", "STOP_RULES", "Draft", "DraftContext", "Drafter", "LMDrafter", "ModelDrafter",
           "PromptLookupDrafter", "RetrievalDrafter", "SharedForwards", "StopRule", "SuffixDrafter", "TreeOptions",
           "WhiteBoxDrafter", "build_drafters", "draft_chain", "draft_tree", "drafter_kinds", "make_stop_rule"]

WHITE_BOX_KINDS = ("eagle", "medusa")  # spec heads that load a head checkpoint onto the target
ZOO_HEADS = "zoo:heads"


def drafter_kinds() -> list[str]:
    return [*DRAFTERS, "lm", *WHITE_BOX_KINDS, "zoo:NAME", "zoo:all", ZOO_HEADS, "a model path or hub id"]


def expand_specs(specs: Sequence[str], target: Any = None) -> list[str]:
    """Expand ``zoo:all`` into every zoo drafter for ``target`` (those that speak its vocabulary;
    without one, the toy zoo's) and ``zoo:heads`` into every zoo white-box head for it."""
    def family() -> str:  # asked only for zoo:all / zoo:heads: another target may have no zoo at all
        return zoo_target_of(output_size(target)) if target is not None else TOY_TARGET

    out: list[str] = []
    for spec in specs:
        if spec == "zoo:all":
            out.extend(f"zoo:{name}" for name in zoo_drafter_names(target=family()))
        elif spec == ZOO_HEADS:
            out.extend(f"zoo:{name}" for name in zoo_head_names(target=family()))
        else:
            out.append(spec)
    return out


def build_drafters(specs: Sequence[str], target: Any, target_tokenizer: Any, options: LoadOptions) -> list[Drafter]:
    """Build the drafter pool from spec strings; names are made unique."""
    drafters = [_build_one(spec, target, target_tokenizer, options) for spec in expand_specs(specs, target)]
    seen: dict[str, int] = {}
    for drafter in drafters:
        count = seen.get(drafter.name, 0)
        seen[drafter.name] = count + 1
        if count:
            drafter.name = f"{drafter.name}#{count + 1}"
    return drafters


def _build_one(spec: str, target: Any, target_tokenizer: Any, options: LoadOptions) -> Drafter:
    if not spec.strip():
        raise DraftwiseError("empty drafter spec; valid: " + ", ".join(drafter_kinds()))
    head = spec.split(":", 1)[0]
    if head in DRAFTERS and head != "lm":
        name, raw = split_spec(spec)
        factory = DRAFTERS.get(name)
        return factory(**typed_options(f"drafter {name!r}", raw, keyword_defaults(factory)))
    if head == "lm":
        model_path, name, tree = _model_spec("lm", spec, "model", "a model path or hub id")
        return _load_lm_drafter(model_path, name, target, target_tokenizer, options, tree)
    if head in WHITE_BOX_KINDS:
        return _load_head_spec(head, spec, target)
    if head == "zoo" and _is_zoo_head(spec):
        return load_head_drafter(spec, target)
    if ":" not in spec and "/" not in spec and not os.path.isdir(os.path.expanduser(spec)):
        raise DraftwiseError(
            f"unknown drafter {spec!r}; valid: {', '.join(drafter_kinds())} (hub ids take the form org/name)")
    return _load_lm_drafter(spec, "", target, target_tokenizer, options)


def _model_spec(kind: str, spec: str, key: str, what: str) -> tuple[str, str, TreeOptions]:
    """``KIND:KEY=PATH[,name=N][,tree options]`` → (path, name, tree options)."""
    _, raw = split_spec(spec)
    if key not in raw:
        raise DraftwiseError(f"drafter {spec!r}: {kind} needs {key}=PATH ({what})")
    path, name = raw.pop(key), raw.pop("name", "")
    tree_defaults = keyword_defaults(TreeOptions.parse)
    unknown = [option for option in raw if option not in tree_defaults]
    if unknown:
        valid = ", ".join([key, "name", *tree_defaults])
        raise DraftwiseError(f"unknown option(s) {', '.join(unknown)} for drafter {kind!r}; valid: {valid}")
    return path, name, TreeOptions.parse(**typed_options(f"drafter {kind!r}", raw, tree_defaults))


def _load_head_spec(kind: str, spec: str, target: Any) -> WhiteBoxDrafter:
    """``eagle:head=PATH[,name=N][,tree options]`` (likewise ``medusa``)."""
    path, name, tree = _model_spec(kind, spec, "head", "a head checkpoint folder or zoo name")
    return load_head_drafter(path, target, kind=kind, name=name, tree=tree)


def _is_zoo_head(spec: str) -> bool:
    try:
        return spec.split(":", 1)[1] in zoo_head_names(target=None)
    except DraftwiseError:  # no zoo installed: the LM path reports it
        return False


def _load_lm_drafter(path: str, name: str, target: Any, target_tokenizer: Any, options: LoadOptions,
                     tree: TreeOptions | None = None) -> LMDrafter:
    model, tokenizer = load_causal_lm(path, options)
    attach_vocab_map(model, load_vocab_map(resolve_model_path(path)))
    check_same_vocabulary(path, model, tokenizer, target, target_tokenizer)
    zoo = path.startswith("zoo:")
    default_name = path.split(":", 1)[1] if zoo else os.path.basename(os.path.normpath(path))
    return LMDrafter(model, name=name or default_name, source=path, tree=tree,
                     domains=zoo_domain_of(path) if zoo else ())


def check_same_vocabulary(path: str, model: Any, tokenizer: Any, target: Any, target_tokenizer: Any) -> None:
    """A drafter must speak the target's vocabulary: same output size, same tokenizer when both have one."""
    size = output_size(model)
    target_size = int(target.get_output_embeddings().weight.shape[0])
    if size != target_size:
        raise DraftwiseError(
            f"drafter {path!r} has a vocabulary of {size} tokens but the target has {target_size}; "
            "a drafter must share the target's tokenizer and vocabulary"
        )
    if tokenizer is not None and target_tokenizer is not None and tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise DraftwiseError(
            f"drafter {path!r} uses a different tokenizer ({len(tokenizer)} tokens) from the target's "
            f"({len(target_tokenizer)} tokens); a drafter must share the target's tokenizer"
        )
