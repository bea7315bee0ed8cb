"""One module per family of Python values the symbolic evaluator models."""
