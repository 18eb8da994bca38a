"""What the operator builds and reads back: the TrainingJob CRD and its status model,
a job's pods, service and config maps (training and background load), the placement of
its racks on nodes and the scheduling policy's checks and per-tensor tags. Pure
functions from a validated job to manifests and back; nothing here talks to an API
server or touches the network (the operator's handlers and the node agent,
tailcut.k8s.agent, do)."""
