"""``python -m dex_core.serving`` (what ``torchrun --nproc-per-node K -m dex_core.serving`` starts on every rank):
``dex serve``'s entry point (``serve.main``)."""

import sys

from .serve import main

sys.exit(main())
