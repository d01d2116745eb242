"""Facts about a node gathered in one SSH round trip: a probe command string and the
parser of its output. No I/O here: the caller runs the command on the node.

May import: parsers, access, settings.
"""
