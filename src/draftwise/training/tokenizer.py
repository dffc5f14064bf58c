"""The zoo tokenizer: byte-level BPE trained on the corpus, saved as a standard HF fast tokenizer.

Digits are split one per token (arithmetic generalises better), every byte is in the base
alphabet (no unknown tokens, Chinese included), and the chat template renders::

    <|user|>\\n{instruction}\\n<|assistant|>\\n{response}<|endoftext|>

so a response ends with EOS and generation stops by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from draftwise.training.corpus import Example

PAD, EOS, USER, ASSISTANT, SYSTEM = "<|pad|>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = (PAD, EOS, USER, ASSISTANT, SYSTEM)  # ids 0..4, in this order

# Jinja: system / user turns render as "<|role|>\n{content}\n"; an assistant turn ends with EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + '<|endoftext|>' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def prompt_text(instruction: str) -> str:
    """The prompt exactly as the chat template renders it with ``add_generation_prompt=True``."""
    return f"{USER}\n{instruction}\n{ASSISTANT}\n"


def example_text(example: Example) -> str:
    return prompt_text(example.instruction) + example.response + EOS


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def as_hf_tokenizer(tokenizer: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int, out: Path) -> PreTrainedTokenizerFast:
    hf = as_hf_tokenizer(train_bpe(texts, vocab_size), max_length)
    hf.save_pretrained(str(out))
    return hf


def encode_examples(tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example]) -> list[list[int]]:
    """Token ids of each example's full text (prompt + response + EOS)."""
    if not examples:
        return []
    return tokenizer([example_text(e) for e in examples], add_special_tokens=False)["input_ids"]


def encode_prompts(tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example]) -> list[list[int]]:
    if not examples:
        return []
    return tokenizer([prompt_text(e.instruction) for e in examples], add_special_tokens=False)["input_ids"]
