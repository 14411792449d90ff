"""Entry point of ``python -m migraphx_ep.driver``."""

import sys

from . import main

sys.exit(main())
