"""`python -m subic_keras.cli`: the `subic` command."""

import sys

from subic_keras.cli import main

sys.exit(main())
