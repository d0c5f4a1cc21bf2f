"""The parity cases of ``scripts/make_parity_fixtures.py``: one module per family, each with a ``CASES`` list."""
