"""The embedded target: a generated ecommerce dataset, its semantic model, and the truth path."""
