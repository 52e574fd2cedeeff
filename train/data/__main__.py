"""``python -m flaxzoo.train.data [--bench] [--stats] [--DataConfig-field value ...]``: prepare and measure a pipeline."""

import sys

from flaxzoo.train.data.stats import main

sys.exit(main())
