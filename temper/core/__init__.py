"""The leaf every room may import: settings, errors, the one reader of YAML config files, MLflow tag names.

Nothing here imports another part of temper, infra or data_contracts (tests/unit/test_layers.py).
"""
