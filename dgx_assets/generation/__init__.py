"""ERNIE-Image generation: the executor-side client, the local launcher, the Spark job and the asset.

Nothing here imports paddle: the model runs behind HTTP in `dgx_assets.serving`, a process of its own.
"""
