"""The model families DEX drives (``SUPPORTED_TYPES``, by ``config.model_type``) and those it refuses with a
reason (``REFUSED``). Torch-free: the trace's schema names the same families (``dex_core.trace.schema``); the stage
view checks a model against them (``dex_core.model.view``)."""

SUPPORTED_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "granite",
    "qwen3_moe",
)
REFUSED = {  # families DEX could drive but does not, and why (anything else: not a decoder-only stack it knows)
    "gemma3": "the multimodal Gemma 3 wraps its text model; load the text-only checkpoint (Gemma3ForCausalLM)",
    "gpt2": "its absolute position embeddings and fused layers are outside what DEX's stage view drives",
}
