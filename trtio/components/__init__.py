"""Engines beside the LLM in an Edge-LLM engine directory (DESIGN §18): one package each."""
