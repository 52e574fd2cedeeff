"""``python -m flaxzoo.train.bench ...``: see ``flaxzoo.train.bench`` (``--help`` lists the flags)."""

import sys

from flaxzoo.train.bench.cli import main

main(sys.argv[1:])
