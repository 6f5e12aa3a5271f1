"""The distributed runtime: explorer processes owned by a parent (``ExplorerGroup``), where they run, one rank's
body, the link over torch.distributed, and a group that torchrun started (rank 0 runs requests, the others follow).
``dex serve``'s prompts under torchrun are serving's (``dex_core.serving.torchrun``)."""
