"""The toy engine definitions (configs only), shipped inside the trtio package as ``trtio._engines``.

Not code: :func:`trtio.testing.toy_engines.default_engines_dir` finds these files in a source checkout
(this folder) or in an installed wheel (``trtio/_engines``).
"""
