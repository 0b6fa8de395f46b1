"""The leaf every room may import: settings, errors, and the one reader of YAML config files.

Nothing here imports another part of temper, infra or data_contracts (tests/unit/test_layers.py).
"""
