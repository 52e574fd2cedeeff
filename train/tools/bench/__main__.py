"""``python -m flaxzoo.train.bench ...``: see ``flaxzoo.train.tools.bench`` (``--help`` lists the flags)."""

import sys

from flaxzoo.train.tools.bench.cli import main

main(sys.argv[1:])
