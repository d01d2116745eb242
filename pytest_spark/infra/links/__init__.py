"""The RoCE fabric links: ibdev2netdev, ibstat, ibv_devinfo, rdma link, ethtool, ``ip``
(``parse``), the one-round-trip link probe and the ping matrix (``probe``), the session's
link facts per node (``gather``) and the link checks (``check``)."""
