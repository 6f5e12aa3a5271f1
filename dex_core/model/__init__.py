"""The model side: finding and reading checkpoints, loading a whole model or one explorer's part, the stage view of
a Hugging Face model, explorers with their tree KV caches, inducing adapters, light proposal heads, the logit lens
and the cost model's weights."""
