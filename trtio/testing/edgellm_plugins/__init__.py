"""Edge-LLM 0.11's TensorRT plugins as numpy models, for :class:`trtio.testing.OnnxEngine`.

One module per plugin family, each written from Edge-LLM's C++ (the files each module's docstring names) and sharing
no code with ``trtio.testing.reference_math`` or the toy models: a second, independent reading of what each runtime
input means. Each model raises :class:`~trtio.testing.edgellm_plugins._common.PluginInputError` (an
:class:`~trtio.InvalidValueError`) on every input the C++ refuses or its kernels would silently mishandle.

:func:`onnx_ops` gives the ``onnx.reference`` operator classes (domain ``trt_edgellm``) that run them.
"""

from __future__ import annotations

from typing import Any

from trtio.testing.edgellm_plugins.attention import attention_plugin
from trtio.testing.edgellm_plugins.conv1d import causal_conv1d
from trtio.testing.edgellm_plugins.dflash import dflash_target_kv_cache_update
from trtio.testing.edgellm_plugins.gdn import gated_delta_net
from trtio.testing.edgellm_plugins.mamba import update_ssm_state
from trtio.testing.edgellm_plugins.moe import fp16_moe_plugin
from trtio.testing.edgellm_plugins.vit import vit_attention_plugin

__all__ = ["onnx_ops"]

# op type -> the numpy model: (node name, inputs, attributes) -> outputs
_MODELS = {
    "AttentionPlugin": attention_plugin,
    "DFlashTargetKVCacheUpdate": dflash_target_kv_cache_update,
    "Fp16MoePlugin": fp16_moe_plugin,
    "causal_conv1d": causal_conv1d,
    "gated_delta_net": gated_delta_net,
    "update_ssm_state": update_ssm_state,
    "ViTAttentionPlugin": vit_attention_plugin,
}


def onnx_ops() -> list[type]:
    """``onnx.reference.op_run.OpRun`` subclasses for every modelled ``trt_edgellm`` op (needs ``onnx``)."""
    from onnx.reference.op_run import OpRun  # noqa: PLC0415 - optional dependency

    ops: list[type] = []
    for op_type, model in _MODELS.items():
        def _run(self: Any, *inputs: Any, _model: Any = model, **attributes: Any) -> tuple[Any, ...]:
            return tuple(_model(self.onnx_node.name, inputs, attributes))

        ops.append(type(op_type, (OpRun,), {"op_domain": "trt_edgellm", "_run": _run}))
    return ops
