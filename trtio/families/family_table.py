"""The family table: every model family trtio binds, in the order the core calls their hooks.

A family is a package of ``trtio/families/`` (``docs/architecture.md``, "Families and components";
``docs/adding-a-family.md`` walks through one): its typed config and its feature, registered here with
:mod:`trtio.features`. The generic modules reach the families through :mod:`trtio.features` alone; the facade
imports this table before anything else.
"""

from __future__ import annotations

from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.families.lora.lora_config import LoraConfig
from trtio.families.mrope.mrope_config import MropeConfig
from trtio.families.spec.spec_config import SpecConfig
from trtio.features import register_family

__all__ = ["FAMILIES", "HybridConfig", "LoraConfig", "MropeConfig", "SpecConfig"]

#: The families' typed configs, in hook order.
FAMILIES = (HybridConfig, MropeConfig, LoraConfig, SpecConfig)
for _family in FAMILIES:
    register_family(_family)
