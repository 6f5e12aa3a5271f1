"""``dex bench``: every method side by side on prompt sets (``bench``), the methods it runs (``methods``), its result
rows (``rows``) and its report (``report``); and real-size layers timed on the device at hand (``real_size``, their
stage step alone: ``stage_step``) with DEX-1/K projected from them (``projection``)."""
