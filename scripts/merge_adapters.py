"""Merge adapter files into one: every depth of every file, each from the first file that has it, with its own
bottleneck (``dex_core.model.adapter_choice.merge_adapters``).

    python scripts/merge_adapters.py runs/merged.safetensors runs/adapters-9-18-27.safetensors \
        runs/adapters-dense.safetensors [--model default]

Use it to keep strong adapters trained long at a few depths beside a dense file's smaller ones at the rest; then
``dex ead`` on the merged file and ``scripts/ship_adapters.py`` store its best set for every K.
"""

from __future__ import annotations

import argparse
import sys

from dex_core.model.adapter_choice import merge_adapters
from dex_core.model.adapters import read_metadata
from dex_core.model.load import load_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="the merged adapter file to write")
    parser.add_argument("files", nargs="+", help="adapter files, the first one's depths first")
    parser.add_argument("--model", default="default", help="the model they are for")
    args = parser.parse_args(argv)
    model, _ = load_model(args.model, device="cpu")  # only its identity is checked
    taken = merge_adapters(args.out, args.files, model)
    widths = read_metadata(args.out)["bottlenecks"]
    for i, path in enumerate(args.files):
        depths = sorted(d for d, j in taken.items() if j == i)
        print(f"{path}: depths {depths} (bottlenecks {sorted({widths[d] for d in depths})})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
