"""DEX as a transformers custom generation method: ``model.generate(..., custom_generate=FOLDER,
trust_remote_code=True)`` imports this file (transformers copies it into its modules cache, so it names the
installed package absolutely). FOLDER is ``dex_core.hf_generate_dir()`` or a Hub repository laid out the same way
(``custom_generate/generate.py``, ``custom_generate/requirements.txt``); docs/SERVING.md."""

from dex_core.serving.hf_generate import generate

__all__ = ["generate"]
