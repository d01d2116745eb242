"""``python -m sparksim`` == ``spark-sim``.

Also runnable as a directory, ``python3 path/to/sparksim ARGS``: sparksim is a top-level
package of its own (standard library only), so its parent directory is all it needs on
``sys.path``.
"""

import importlib
import os
import sys

if not __package__:
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.exit(importlib.import_module("sparksim.cli").main())
