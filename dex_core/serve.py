"""``python -m dex_core.serve``, the entry point torchrun starts: ``dex_core.distributed.serve``."""

import sys

from .distributed.serve import main

if __name__ == "__main__":
    sys.exit(main())
