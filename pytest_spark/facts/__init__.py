"""Facts about a node gathered in one SSH round trip: a probe command string and the
parser of its output (``links``, ``preflight``, ``server``), and what a collective run
brought back (``collective``: every rank's output, rank 0's parsed result). No I/O here: the
caller runs the command on the node.

May import: parsers, access, settings.
"""
