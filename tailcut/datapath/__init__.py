"""The datapath: loaders for the BPF programs under ebpf/, one module per program.

Each program `ebpf/<stem>.bpf.c` (with its shared types and map descriptions in
`ebpf/<stem>.h`) has its loader here in `<stem>.py`; a test keeps the two lists equal.
The modules in HELPERS are shared plumbing, not loaders:

    bcc      compile ebpf/<stem>.bpf.c with BCC, turning failures into DatapathError
    bpfsys   raw bpf(2) calls (tiny programs, maps, elements) for the feature probes
             and bpfcache
    bpfcache compile a program once per machine, keep its image on disk, load it with
             bpf(2) (the dropper's and the XDP counter's: no compile per run or role)
    ringbuf  read a BPF ring buffer map through mmap, as libbpf does (bpfcache's)
    clsact   tc filters on clsact hooks; who added the clsact qdisc, shared by all
    torformat  the ToR store's wire format and fixed point (loader and clients share it)
    ports    RackProgram: a ToR program's filters on rack ports, counters, detach (tor,
             agg, mcast)
    aggformat  in-network aggregation's wire format (loader, senders and the PS share it)
    mcastformat  the parameters' multicast wire format (loader, PS and workers share it)
    torwire  the one reader of the three ToR formats' C headers (the *format modules')
"""

HELPERS = frozenset({"bcc", "bpfsys", "bpfcache", "ringbuf", "clsact",
                     "torformat", "aggformat",
                     "mcastformat", "torwire", "ports"})
