"""``python -m pytest_spark.sim`` == ``spark-sim``.

Also runnable as a directory, ``python3 path/to/pytest_spark/sim ARGS``: then this
package is loaded on its own (as ``sparksim``), without importing ``pytest_spark`` and its
dependencies, so the sim works on a bare machine with only the standard library.
"""

import importlib
import importlib.util
import os
import sys

if __package__:
    from .cli import main
else:
    here = os.path.dirname(os.path.abspath(__file__))
    del sys.path[0]  # this directory: its modules are not top-level modules
    spec = importlib.util.spec_from_file_location(
        "sparksim", os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["sparksim"] = package
    spec.loader.exec_module(package)
    main = importlib.import_module("sparksim.cli").main

sys.exit(main())
