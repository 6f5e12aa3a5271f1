"""The baselines DEX is measured against: self-speculation and Hugging Face's early exit and prompt lookup
(``speculation``), adaptive depth selection (``selectors``), tensor-parallel AR (``tensor_parallel``)."""
