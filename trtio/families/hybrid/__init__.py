"""Hybrid models: recurrent layers (Gated DeltaNet, Mamba2) beside the attention layers."""
