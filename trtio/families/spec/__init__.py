"""Speculative drafts: EAGLE3, MTP and DFlash pairs."""
