"""Gemma 4 text models: per-layer KV geometry, sliding windows (full and bounded SWA storage), KV sharing, dual RoPE
and per-layer embeddings (PLE)."""
