"""``python -m train.data [--bench] [--stats] [--DataConfig-field value ...]``: prepare and measure a pipeline."""

import sys

from train.data.stats import main

sys.exit(main())
