"""Exit statuses of a role process, shared by the roles and the runtime that reads them."""

OK = 0
FAILED = 1          # the run failed here (an error event says why)
USAGE = 2           # the command line or the role config is wrong
PEER_GONE = 3       # failed only because another role went away first
