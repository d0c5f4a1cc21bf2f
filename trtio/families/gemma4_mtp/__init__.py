"""Gemma 4 MTP pairs (Edge-LLM 0.11's ``spec_decode_type`` ``gemma4_mtp``): a Gemma 4 target and its assistant, a
KV-less draft that reads the target's KV pools (``gemma4_mtp_config.py``: the typed config, the draft's bindings;
``assistant.py``: its steps; ``gemma4_mtp_feature.py``: its part of a spec-decode setup; ``ddtree.py``: the verify
tree of a top-K > 1 round)."""
