"""The data: prompt sets (HumanEval, ShareGPT chat with its held-out split, MT-bench grounded, built-in) and token
rankings derived from text or a tokenizer. No model code."""
