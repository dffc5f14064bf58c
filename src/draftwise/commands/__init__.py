"""CLI subcommands of the core engine (others live beside their packages: sim, zoo, bench)."""
