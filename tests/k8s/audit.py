"""Read the test API server's audit log: what one identity did, and what its role grants."""

import json


def requests_by(cp, user: str) -> list[dict]:
    """Audit events of `user`'s requests on resources (not discovery URLs)."""
    events = []
    for line in cp.audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == user and event.get("objectRef"):
            events.append(event)
    return events


def denied(events: list[dict]) -> list[tuple]:
    return sorted({(e["verb"], e["objectRef"].get("resource"), e["responseStatus"]["code"])
                   for e in events if e["responseStatus"]["code"] == 403})


def used(events: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every request made."""
    out = set()
    for e in events:
        ref = e["objectRef"]
        res = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.add((ref.get("apiGroup", ""), res, e["verb"]))
    return out


def granted(cp, name: str, namespace=None) -> set[tuple[str, str, str]]:
    """The rules of ClusterRole `name` (of Role `name` in `namespace`), empty if there
    is none."""
    kind = ["-n", namespace, "role"] if namespace else ["clusterrole"]
    out = cp.kubectl("get", *kind, name, "--ignore-not-found", "-o", "json").stdout
    if not out.strip():
        return set()
    role = json.loads(out)
    return {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}
