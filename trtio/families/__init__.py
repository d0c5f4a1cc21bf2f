"""Model families, one folder each (``docs/architecture.md``, "Families and components"): a family's typed config,
its feature, its pools. The table that registers them is :mod:`trtio.families.family_table`.

The typed configs are public: ``cfg.feature(HybridConfig)`` returns a config's hybrid part, or None.
"""

from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.families.gemma4_mtp.gemma4_mtp_config import Gemma4MtpConfig
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.families.lora.lora_config import LoraConfig
from trtio.families.mrope.mrope_config import MropeConfig
from trtio.families.spec.spec_config import SpecConfig

__all__ = ["Gemma4Config", "Gemma4MtpConfig", "HybridConfig", "LoraConfig", "MropeConfig", "SpecConfig"]
