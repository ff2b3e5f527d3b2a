"""The ERNIE-Image serving process and the small Paddle generator it serves offline.

Runs in a process of its own (`dgx-assets serve`, `python -m dgx_assets.serving`). Nothing the Dagster
code location imports may import this package's server, engine or generator modules: they load paddle.
"""
