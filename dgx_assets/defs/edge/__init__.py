"""The `edge` group: edge_model (the TFLite format ladder and its parity gate) and champion_model (the
registry's champion alias)."""
