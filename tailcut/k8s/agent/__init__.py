"""The node agent: builds each job's network on its node and wires the job's pods in.

Runs on every node (a DaemonSet with hostPID and the capabilities listed in the
chart's values.yaml). It watches the tailcut pods scheduled to its node and acts only
for those a TrainingJob controls, building only from that TrainingJob: its spec and the
placement the operator recorded in its status (tailcut.k8s.agent.admission says what
is checked). When the first pod of a job is running there, it builds that job's spine and racks on the node
(namespaces, ToR bridges, uplinks shaped both ways) from the same topology plan and
with the same code as `tailcut run` (tailcut.net.topology, tailcut.net.build). Then
for each of the job's pods as it runs, it finds a process of the pod (from the
container runtime's record, else by the pod's UID in /proc/<pid>/cgroup), gives that
process's network namespace a name (a bind mount under /run/netns, as `ip netns
attach` does, but only inside the agent's own mount namespace) and wires the pod into
its rack through a second interface, tc0, with the pod's address of the plan (as
meshnet-cni and Multus add interfaces; the CNI's eth0 keeps the default route for DNS
and the API server). Both directions of the access
link are shaped, and with spec.scheduling.policy cadentflow both ends of every link
get the HTB priority classes and the DSCP classifier (tailcut.scheduling.enforce), as
under `tailcut run`. What was applied goes on the pod as the annotation
tailcut.dev/network; the operator gathers it into the job's status.network. When the
pod ends, the packets its links' full queues dropped (both ends of its access link and
of its rack's uplink, so far) go on it as tailcut.dev/queue-drops, which the operator
gathers into status.queueDrops (network.json's queue_drops under `tailcut run`). Both
are written through the pod's status subresource: the agent may not patch pods, so it
cannot change what any pod runs.

When the pod goes (deleted, Succeeded or Failed, or missing when the agent relists)
the agent removes its access link (and with it tc0 and their filters) and drops the
name; when the last pod of a job on the node has gone, it removes the job's spine and
racks. On SIGTERM it does all of that for every job, when its pod goes. The job's
namespaces are named only inside the agent's mount namespace; the holder, a second
container of the agent's pod, keeps an open file of each (holder.py), so an agent
that dies or whose container alone restarts leaves them, and the next agent adopts
them as they are. When the whole pod goes, the kernel frees a namespace no name and
no file holds, and with it the veths into the pods.

Names: tck8s-<first 12 characters of the pod UID> for a pod,
tck8s-<namespace>.<job>@<node>.rack-<r> and .spine for a job's fabric. Not "tailcut-":
`tailcut clean` would otherwise take them for leftovers of a local run.

The operator never touches netlink; this is the one privileged place.

Here: admission (which pods, built from what), podns (a pod's network namespace found
and named), wiring (a job's fabric and its pods wired in, or adopted), daemon (the
Agent: the watch over the node's pods), holder (the fabrics kept across a restart),
errors, and __main__ (`python -m tailcut.k8s.agent`, the
DaemonSet's entry point). Not here: the manifests whose labels and annotations the
agent reads and writes (tailcut.k8s.manifests), the network building it shares with
`tailcut run` (tailcut.net), and the local cluster it runs on in tests (tailcut.k8s.node).
"""
