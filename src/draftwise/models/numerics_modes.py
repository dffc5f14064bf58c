"""The target's numerics by name, with what each costs and guarantees: light (no torch), so the
command line lists them; :mod:`draftwise.models.numerics` builds them."""

from __future__ import annotations

AUTO = "auto"  # the checkpoint's own precision, computed token-exact (int4 for 4-bit weights), native off the CPU

# name → what it is and what it guarantees (docs/numerics.md has the costs)
NUMERICS_MODES: dict[str, str] = {
    "int4": "4-bit weights in groups of 32 (GGUF Q4_1's layout) times bfloat16 activations, float32 elsewhere; "
            "token-exact; CPU",
    "bfloat16": "bfloat16 weights, products on fixed blocks of 16 rows, float32 elsewhere; token-exact; CPU",
    "float32": "float32 weights, one row at a time; token-exact; CPU",
    "native": "the model as transformers computes it, in --dtype, on any device; outputs may differ from plain "
              "decoding at near-ties",
}
EXACT_MODES = ("int4", "bfloat16", "float32")  # coarsest weights first
NUMERICS_CHOICES = (AUTO, *NUMERICS_MODES)
NUMERICS_HELP = ("how the target computes: auto (default: the checkpoint's own precision, token-exact; int4 for the "
                 "default target's 4-bit GGUF), int4, bfloat16, float32 (each token-exact on CPU: a k-token forward "
                 "gives each row the bits of k one-token forwards), or native (as transformers computes, in --dtype, "
                 "on any device; may differ from plain decoding at near-ties); docs/numerics.md")
