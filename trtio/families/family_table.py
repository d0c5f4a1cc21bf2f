"""The family table: every model family trtio binds, in the order the core calls their hooks.

A family is a package of ``trtio/families/`` (``docs/architecture.md``, "Families and components";
``docs/adding-a-family.md`` walks through one): its typed config and its feature, registered here with
:mod:`trtio.features`. The generic modules reach the families through :mod:`trtio.features` alone; the facade
imports this table before anything else.
"""

from __future__ import annotations

from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.families.gemma4.gemma4_feature import Gemma4Feature
from trtio.families.gemma4_mtp.gemma4_mtp_config import Gemma4MtpConfig
from trtio.families.gemma4_mtp.gemma4_mtp_feature import Gemma4MtpFeature
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.families.hybrid.hybrid_feature import HybridFeature
from trtio.families.lora.lora_config import LoraConfig
from trtio.families.lora.lora_feature import LoraFeature
from trtio.families.mrope.mrope_config import MropeConfig
from trtio.families.mrope.mrope_feature import MropeFeature
from trtio.families.spec.dflash import DFlashFeature
from trtio.families.spec.spec_config import SpecConfig
from trtio.features import FamilyConfig, Feature, register_family, register_feature

__all__ = ["FAMILIES", "Gemma4Config", "Gemma4MtpConfig", "HybridConfig", "LoraConfig", "MropeConfig", "SpecConfig"]

#: Each family: its typed config and its feature (None: nothing at run time), in hook order.
FAMILIES: tuple[tuple[type[FamilyConfig], type[Feature] | None], ...] = (
    (HybridConfig, HybridFeature),
    (MropeConfig, MropeFeature),
    (LoraConfig, LoraFeature),
    (SpecConfig, DFlashFeature),
    (Gemma4Config, Gemma4Feature),
    (Gemma4MtpConfig, Gemma4MtpFeature),
)
for _config, _feature in FAMILIES:
    register_family(_config)
    if _feature is not None:
        register_feature(_feature, _config)
