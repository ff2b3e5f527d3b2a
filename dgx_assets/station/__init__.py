"""The inspection station's runtime: the TFLite edge model run with LiteRT on a folder or over HTTP (`edge-run`).

Installed alone by the `edge` extra: it imports nothing of the code location, only the shared HTTP limits.
"""
