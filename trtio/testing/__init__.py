"""Helpers for testing trtio, and runtimes built on it, without a GPU or TensorRT."""
