"""Serving: DEX behind the interfaces people call. The OpenAI-compatible HTTP API (``api``: the FastAPI app and
``serve_http``), its request parsing (``api_requests``: a body checked field by field, or a 4xx) and its Prometheus
metrics (``metrics``); DEX through ``model.generate(custom_generate=...)`` (``hf_generate`` and its Hub-layout folder
``hub_method``); ``dex serve``'s entry point (``serve``; ``python -m dex_core.serving``, what torchrun starts) and its
prompts read by rank 0 of a torchrun launch (``torchrun``).

May import the facade (``dex_core.decoder``) and everything below it; never ``training`` or ``evaluation``, and
nothing above (the CLI)."""
