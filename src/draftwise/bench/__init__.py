"""The benchmark harness behind ``draftwise bench``: prompt sets, a registry of methods, a
resumable runner, paper-shaped reports and plots. See ``docs/bench.md``.

>>> from draftwise.bench.runner import BenchConfig, run_bench      # doctest: +SKIP
>>> from draftwise.bench.methods import METHODS, register_method    # doctest: +SKIP
"""
