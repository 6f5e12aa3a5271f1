"""The distributed runtime: explorer processes owned by a parent (``ExplorerGroup``), one rank's body, the link
over torch.distributed, and ``dex serve`` under torchrun."""
