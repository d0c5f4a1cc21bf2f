"""The ``trtio`` command's tools: the demo, engine inspection, memory planning, binding tables.

Tools sit on top of the library (core and setups) and may use :mod:`trtio.testing` (the shipped toy
model and reference engine); nothing in the library imports them.
"""
