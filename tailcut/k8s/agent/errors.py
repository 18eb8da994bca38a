"""What the node agent raises: a pod it could not wire, a node that cannot carry a job."""

from tailcut.errors import NoKernelHeaders, TailcutError


class AgentError(TailcutError):
    """A pod could not be wired; the message names the pod and the reason."""


class NodeUnfit(AgentError):
    """This node cannot carry the job as specified (its network's MTU); retrying will
    not help, so the job fails at once (resources.ANNOTATION_NODE_UNFIT)."""


# What no retry mends: the operator fails the job at once, with the agent's words.
UNFIT = (NodeUnfit, NoKernelHeaders)
