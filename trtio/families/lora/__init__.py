"""LoRA adapters bound to an engine's LoRA inputs."""
