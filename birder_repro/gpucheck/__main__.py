"""``python -m birder_repro.gpucheck`` (``make gpu-check``)."""

import sys

from birder_repro.gpucheck import main

sys.exit(main())
