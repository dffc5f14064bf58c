"""The target's numerics by name, with what each costs and guarantees: light (no torch), so the
command line lists them; :mod:`draftwise.models.numerics` builds them."""

from __future__ import annotations

AUTO = "auto"  # the fastest exact mode keeping the checkpoint's precision (measured), native off the CPU

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
# The exact modes that compute a checkpoint's weights without losing their precision, its own first:
# ``auto`` takes the fastest of them on the machine (float32 holds 4-bit and bfloat16 weights exactly)
KEEPING: dict[str, tuple[str, ...]] = {"int4": ("int4", "float32"), "bfloat16": ("bfloat16", "float32"),
                                       "float32": ("float32",)}
NUMERICS_CHOICES = (AUTO, *NUMERICS_MODES)
NUMERICS_HELP = ("how the target computes: auto (default: the fastest token-exact mode on this machine that keeps "
                 "the checkpoint's precision, measured once; int4 for the default target's 4-bit GGUF), int4, "
                 "bfloat16, float32 (each token-exact on CPU: a k-token forward "
                 "gives each row the bits of k one-token forwards), or native (as transformers computes, in --dtype, "
                 "on any device; may differ from plain decoding at near-ties); docs/numerics.md")
