"""The Kubernetes commands of `tailcut`: a local cluster, its images, a job's results.

    tailcut cluster up [--nodes N] [--kind-like K] | down [--purge-images] | status
                                              a real cluster here
    tailcut images build [--load] [--torch]   the three images (--torch: and the
                                              worker with PyTorch), from their Dockerfiles
    tailcut collect JOB [-n NS]               a finished job's results from its pods' logs
"""

import argparse
import json
from pathlib import Path
from typing import Any

from tailcut.k8s.node import cluster as node_cluster
from tailcut.k8s.node import images, procs


def add_parsers(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="a real Kubernetes cluster on this host "
                             "(containerd, kubelet, control plane; root)")
    cluster.add_argument("action", choices=["up", "down", "status"])
    cluster.add_argument("--workdir", type=Path, default=node_cluster.DEFAULT_WORKDIR,
                         help="where the cluster keeps its state, logs and files "
                         "(default: %(default)s)")
    cluster.add_argument("--nodes", type=int, default=1,
                         help="with up: how many nodes, each its own network namespace "
                         "with its own containerd, kubelet and kube-proxy (default 1)")
    cluster.add_argument("--first-node", type=int, default=0,
                         help="with up: the first node's number (tcnode-<n>, its "
                         "addresses): clusters numbered apart run side by side (default 0)")
    cluster.add_argument("--kind-like", type=int, default=0, metavar="K",
                         help="with up: the last K nodes look like kind's as its defaults "
                         "make them: LAN MTU 1500 and an empty /usr/src (no kernel "
                         "headers), to see what a kind user meets (default 0)")
    cluster.add_argument("--no-images", action="store_true",
                         help="with up: do not build and load tailcut's images")
    cluster.add_argument("--torch", action="store_true",
                         help="with up: also build and load the worker image with PyTorch")
    cluster.add_argument("--purge-images", action="store_true",
                         help="with down: also remove the nodes' image stores, which "
                         "otherwise stay so the next `up` imports nothing it holds")
    cluster.set_defaults(handler=_cluster)

    build = sub.add_parser("images", help="build the operator, agent and worker images "
                           "from their Dockerfiles with buildah (no Docker needed)")
    build.add_argument("action", choices=["build"])
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument("--load", action="store_true",
                       help="also load them into the cluster of `tailcut cluster up`")
    build.add_argument("--torch", action="store_true",
                       help="also the worker image with PyTorch (workers/torch.Dockerfile, "
                       "about 650 MiB more), for torch and allreduce jobs (the chart's "
                       "workers.torchImage)")
    build.set_defaults(handler=_images)

    fetch = sub.add_parser("collect", help="a finished TrainingJob's results from its pods' "
                           "logs: the results directory `tailcut run` leaves")
    fetch.add_argument("job", help="the TrainingJob's name")
    fetch.add_argument("-n", "--namespace", default="default")
    fetch.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    fetch.add_argument("--results-dir", type=Path,
                       help="where to write them (default: results/<job>-k8s-<time>)")
    fetch.set_defaults(handler=_collect)


def _cluster(args: argparse.Namespace) -> int:
    if args.action == "down":
        node_cluster.Cluster.down(args.workdir, purge_images=args.purge_images)
        return 0
    if args.action == "status":
        found = node_cluster.Cluster.load(args.workdir)
        if found is None:
            print(f"no cluster in {args.workdir}")
            return 1
        for name, pid in found.pids.items():
            state = "running" if procs.alive(pid) else "NOT RUNNING"
            print(f"{name:<24} pid {pid:<8} {state}")
        print(f"export KUBECONFIG={found.kubeconfig}")
        return 0
    # Built (or found cached) first, so each node imports them while the rest comes up.
    archives = [] if args.no_images else list(images.build_all(torch=args.torch).values())
    up = node_cluster.Cluster.up(args.workdir, nodes=args.nodes, images=archives,
                                 index=args.first_node, kind_like=args.kind_like)
    print(f"kubeconfig: {up.kubeconfig}\n\nexport KUBECONFIG={up.kubeconfig}")
    return 0


def _images(args: argparse.Namespace) -> int:
    archives = images.build_all(force=args.force, torch=args.torch)
    if args.load:
        up = node_cluster.Cluster.load()
        if up is None:
            print("tailcut: no cluster is up (tailcut cluster up)")
            return 1
        print(f"loading {', '.join(images.ref(name) for name in archives)}")
        up.load_images(list(archives.values()))
    print(json.dumps({name: str(path) for name, path in archives.items()}, indent=1))
    return 0


def _collect(args: argparse.Namespace) -> int:
    # Here, not at the top: it brings the planner and the spec (0.6 s of imports) that
    # `cluster up` and `images build` do not need.
    from tailcut.k8s import collect
    out = collect.collect(args.job, args.namespace, args.kubeconfig,
                          args.results_dir or collect.default_dir(args.job))
    print(f"results: {out}")
    return 0
