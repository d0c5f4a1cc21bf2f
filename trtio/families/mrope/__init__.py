"""Vision-language models' LLM side: MRoPE (a RoPE table per slot) and deepstack features."""
