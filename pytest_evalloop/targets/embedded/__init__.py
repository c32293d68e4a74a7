"""The embedded target: a generated ecommerce dataset, its semantic model, and the truth path.

Part of `pytest_evalloop.targets` (layer 7 of the order in `tests/test_architecture.py`): it
may import what `targets` may (`sets` for the goldens it derives), never `answer` or above.
"""
