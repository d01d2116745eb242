"""The ``launch-cluster`` launcher: eugr/spark-vllm-docker's ``launch-cluster.sh`` on the head
over SSH, the way operators start it by hand::

    nohup ./launch-cluster.sh -n IP,IP -t IMAGE --name NAME exec vllm serve ... &

and ``launch-cluster.sh --name NAME stop`` again; works unchanged against the real script on
real Sparks and the one sparksim installs. One file per role: ``commands`` (the shell
command lines), ``driver`` (running them on the head: the script's checks, the start, its
log; the -n list and the Ray flag), ``dotenv`` (the script's ``.env``: read, and what it
overrides), ``launcher`` (the plug-in: stand up, watch, tear down)."""
