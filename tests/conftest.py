"""Tiny random float64 models of each supported family, built offline from configs."""

import pytest

from dex_core.models import tiny_model, tiny_tokenizer  # noqa: F401  (tests import them from here)


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny Llama + tokenizer directory, loadable with ``--model DIR``."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path
