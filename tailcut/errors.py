"""Every exception tailcut raises on purpose, in one tree.

    TailcutError
    ├── SpecError            a TrainingJob is invalid; the message names the field
    ├── KernelFeatureMissing this kernel lacks what the job asks for (netem, XDP, ...)
    ├── NetError             building or tearing down the emulated network failed
    │   └── AlreadyExists    a job with this name still has namespaces on this host
    ├── DatapathError        a BPF program failed to compile, load or attach
    │   └── NoKernelHeaders  BCC would find no headers of the running kernel
    ├── RunError             a training run failed (a role exited, a timeout)
    │   └── PSGone           (training.worker) the parameter server went away
    ├── ConfigError          (training.config) a role's config file is invalid
    ├── CountersError        (training.tcpstats) the kernel's TCP counters are unreadable
    └── TransportError       (transports.base) sending or receiving failed
        ├── ProtocolError    the peer's bytes do not follow the framing
        ├── PeerClosed       the peer closed the connection or is gone
        │   └── ClosedMidFrame  ... in the middle of a frame (also a ProtocolError)
        └── TransportTimeout nothing arrived in time

Callers catch TailcutError to print a one-line message; anything else is a bug.

`tailcut run`'s exit codes, one for each way a run ends (docs/fidelity.md), are here
too: the reproduce steps and the operator's local backend read them without the runtime.
"""

EXIT_FINISHED = 0
EXIT_FAILED = 1             # a TailcutError
EXIT_SPEC = 2               # the spec or the command line was refused
EXIT_TARGET_NOT_REACHED = 3  # finished without reaching targetAccuracy
EXIT_NOT_NETWORK_BOUND = 4   # finished, but --require-fidelity and not network-bound
EXIT_INTERRUPTED = 130


class TailcutError(Exception):
    """Base of every error tailcut raises deliberately."""


class SpecError(TailcutError):
    """A TrainingJob spec is invalid. The message names the field and the fix."""


class KernelFeatureMissing(TailcutError):
    """The running kernel lacks a feature the job needs."""


class NetError(TailcutError):
    """Building or removing the emulated network failed."""


class AlreadyExists(NetError):
    """Objects of a job with this name already exist on the host."""


class DatapathError(TailcutError):
    """A BPF program failed to compile, load or attach."""


class NoKernelHeaders(DatapathError):
    """A program must be compiled and the running kernel's headers are not there."""


class RunError(TailcutError):
    """A training run failed."""


def detach_all(handles: "list[object]", how: str = "detach") -> None:
    """Call `detach()` (or the method named `how`) on every handle (BPF droppers,
    classifiers), even if one fails; the first error is raised once all were tried, so
    one failure leaks nothing else."""
    failed: BaseException | None = None
    for handle in handles:
        try:
            getattr(handle, how)()
        except Exception as err:   # noqa: BLE001 - the others must still go
            failed = failed or err
    if failed is not None:
        raise failed
