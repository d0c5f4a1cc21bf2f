"""Small configs shared by the tests."""

from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig


def llm_config(**kw) -> LLMEngineConfig:
    base = dict(hidden_size=64, vocab_size=512, max_supported_batch_size=4, max_supported_input_length=64,
                max_kv_cache_capacity=128, num_attention_layers=2, num_attention_heads=4, num_kv_heads=2,
                head_dim=16, rotary_dim=16)
    base.update(kw)
    return LLMEngineConfig(**base).validate()


def bundle(*, verify_size=6, max_verify=8, max_proposal=8, top_k=2, step=3, draft_hidden=64,
           base_input=64, draft_input=48, draft_vocab=600, base_batch=4, draft_batch=4, **base_kw) -> DeploymentConfig:
    base = llm_config(is_spec_decode_base=True, max_verify_tree_size=max_verify,
                      max_supported_input_length=base_input, max_supported_batch_size=base_batch, **base_kw)
    draft = llm_config(hidden_size=draft_hidden, base_model_hidden_size=64, max_draft_tree_size=max(max_proposal, 1),
                       num_attention_layers=1, max_supported_input_length=draft_input, vocab_size=draft_vocab,
                       max_supported_batch_size=draft_batch,
                       activation_dtype=base_kw.get("activation_dtype", "float16"))
    spec = SpecDecodeConfig(base_output_hidden_dim=64, draft_hidden_size=draft_hidden, max_verify_size=max_verify,
                            max_draft_proposal_size=max_proposal, drafting_top_k=top_k, drafting_step=step,
                            verify_size=verify_size)
    return DeploymentConfig(base, draft, spec).validate()


# A tiny model, so that a thousand setups take a few seconds: one layer, 16 wide, 32 tokens.
TINY = dict(hidden_size=16, vocab_size=32, max_supported_batch_size=2, max_supported_input_length=8,
            max_kv_cache_capacity=32, num_attention_layers=1, num_attention_heads=2, num_kv_heads=1, head_dim=8,
            rotary_dim=8)


def tiny_llm(contract, *, page=16, pool=0, **over) -> LLMEngineConfig:
    """The tiny model on ``contract``; on the ragged one with pages of ``page`` tokens in pools of ``pool``
    (0: every slot's pages)."""
    fields = {"contract": "ragged", "kv_page_size": page, "kv_pool_pages": pool} if contract == "ragged" else {}
    return LLMEngineConfig(**{**TINY, **fields, **over}).validate()


def tiny_bundle(contract, *, page=16, pool=0) -> DeploymentConfig:
    """An EAGLE pair of the tiny model: trees of 2 x 2 draft nodes, 4 verify nodes."""
    base = tiny_llm(contract, page=page, pool=pool, is_spec_decode_base=True, max_verify_tree_size=4)
    draft = tiny_llm(contract, page=page, pool=pool, base_model_hidden_size=16, max_draft_tree_size=4)
    spec = SpecDecodeConfig(base_output_hidden_dim=16, draft_hidden_size=16, max_verify_size=4,
                            max_draft_proposal_size=4, drafting_top_k=2, drafting_step=2, verify_size=4)
    return DeploymentConfig(base, draft, spec).validate()
