"""The serving command's checks (``check``) over what the server was started with, read
from the node (``gather``): the ``vllm serve`` arguments are parsed by the shared
:mod:`pytest_spark.infra.serveargs`, the command read by :mod:`pytest_spark.infra.servecmd`."""
