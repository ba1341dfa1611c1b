"""Generate every file made from the node schemas: the help pages and the Chinese locale
(``build_node_help.py``), and the node contract (``build_node_contract.py``).

    python scripts/build_nodes.py          # (re)write them
    python scripts/build_nodes.py --check  # exit 1 if a file on disk differs from what they make

Run it after adding or changing a node (the bundled workflows have their own: build_workflows.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_node_contract  # noqa: E402  (the scripts beside this one)
import build_node_help  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    flags = ["--check"] if args.check else []
    return max(build_node_help.main(flags), build_node_contract.main(flags))


if __name__ == "__main__":
    sys.exit(main())
