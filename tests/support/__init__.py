"""Helpers the tests share that the product has no use for (tests/ is on sys.path: `from support import ...`)."""
