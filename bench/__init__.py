"""Benchmarks: every hot path of dgx_assets against the best plain baseline on the same machine (issue 8).

One script per benchmark (`python -m bench.<name> [--quick]`), all of them with `python -m bench.run_all`.
"""
