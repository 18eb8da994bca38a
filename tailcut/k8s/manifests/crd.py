"""Generate the TrainingJob CustomResourceDefinition from the spec models.

tailcut.spec is the one source of truth: the CRD's openAPIV3Schema is pydantic's JSON
schema of `JobSpec` rewritten into a Kubernetes *structural* schema, so the API server
itself rejects a bad spec and names the field. `tailcut crd` writes it; a test fails
when the checked-in manifests/crd.yaml or the chart's copy drift from the models.

What the rewrite does, and why:
- `$ref`/`$defs` are inlined (structural schemas have no references).
- `anyOf: [X, {type: null}]` (an Optional field) becomes X with `nullable: true`.
- Any other `anyOf`/`oneOf` of objects (a tagged union, such as transports with their
  own fields) becomes one object holding the union of their properties; a `const`
  discriminator becomes an enum of every variant's value. Structural schemas forbid
  differently shaped alternatives; the operator still validates with the models.
- JSON Schema's numeric `exclusiveMinimum: 0` becomes OpenAPI 3.0's
  `minimum: 0, exclusiveMinimum: true`; `const` becomes a one-value enum.
- `additionalProperties: false` is dropped: the API server prunes unknown fields, and
  kubectl's default strict field validation turns them into an error naming the field.
- Defaults are kept where they are of the field's own type (a bandwidth default is an
  int in Python but a string in YAML, so it is left to the models), and every nested
  section defaults to {} so the defaults inside it apply when it is left out.
- Choices checked by validators rather than types (known models, transports) become
  enums from the constants in tailcut.spec.model, so they grow with it.
"""

import copy
from pathlib import Path
from typing import Any

import yaml

from tailcut.k8s.manifests import status as status_model
from tailcut.spec import flowsizes, model

GROUP = "tailcut.dev"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj", "tjob"]
CRD_NAME = f"{PLURAL}.{GROUP}"



def _choices() -> dict[tuple[str, ...], tuple[str, ...]]:
    """Fields whose allowed values a validator checks, not their type: (path under
    spec) -> the values, read from tailcut.spec.model when the CRD is generated.
    (Model names come from the training registry where the spec asks it for them.)"""
    out: dict[tuple[str, ...], tuple[str, ...]] = {
        ("training", "model"): model.known_models() + model.torch_models()
        + (model.TORCH_MODEL,)}
    for path, constant in ((("transport", "type"), "TRANSPORTS"),
                           (("training", "syncMode"), "SYNC_MODES"),
                           (("scheduling", "policy"), "SCHEDULING_POLICIES")):
        out[path] = tuple(getattr(model, constant, ()))
    out[("backgroundLoad", "flowSizes", "distribution")] = flowsizes.DISTRIBUTIONS
    return {path: values for path, values in out.items() if values}


_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}
_DROP = {"title", "additionalProperties", "discriminator", "$defs", "examples"}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Transport", "type": "string", "jsonPath": ".spec.transport.type"},
    {"name": "P", "type": "number", "jsonPath": ".spec.transport.p",
     "description": "bounded-loss transport: fraction of each message delivered"},
    {"name": "Workers", "type": "integer", "jsonPath": ".spec.replicas.workers",
     "priority": 1},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress"},
    {"name": "JCT-s", "type": "number", "jsonPath": ".status.jctSeconds",
     "description": "job completion time in seconds"},
    {"name": "Accuracy", "type": "number", "jsonPath": ".status.accuracy"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def spec_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of `.spec`, from tailcut.spec.model.JobSpec."""
    raw = model.JobSpec.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    _default_empty_sections(schema)
    for path, values in _choices().items():
        node = _at(schema, path)
        if node is not None and node.get("type") == "string" and "enum" not in node:
            node["enum"] = list(values)
    schema["description"] = ("What to run and on which network; see tailcut.spec.model "
                             "(`tailcut validate` checks a file offline)")
    return schema


def status_schema() -> dict[str, Any]:
    """The openAPIV3Schema of `.status`, from tailcut.k8s.manifests.status.Status."""
    raw = status_model.Status.model_json_schema(by_alias=True, mode="serialization")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    conditions = schema["properties"]["conditions"]
    # Conditions are merged by type, as every Kubernetes controller does.
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def definition() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "tailcut"},
            "annotations": {"tailcut.dev/generated-by":
                            "tailcut crd (from tailcut/spec/model.py); do not edit"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": model.KIND, "listKind": f"{model.KIND}List",
                      "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": ["tailcut"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A distributed training run over an emulated network",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema(),
                        "status": status_schema(),
                    },
                    # Every pod, netns and interface name derives from the job's name.
                    "x-kubernetes-validations": [{
                        "rule": "self.metadata.name.size() <= 40",
                        "message": "metadata.name: at most 40 characters (tailcut "
                                   "derives namespace and interface names from it)",
                        "reason": "FieldValueInvalid",
                    }],
                }},
            }],
        },
    }


def render() -> str:
    """The CRD as the YAML that `tailcut crd` writes."""
    header = ("# Generated by `tailcut crd` from tailcut/spec/model.py and "
              "tailcut/k8s/manifests/status.py. Do not edit:\n# change the models and rerun "
              "`tailcut crd --write` (tests/k8s/test_crd.py fails on drift).\n")
    return header + str(yaml.safe_dump(definition(), sort_keys=False, width=100))


def checked_in_paths() -> list[Path]:
    """Where the repository keeps copies of the CRD (kubectl users, the Helm chart)."""
    root = Path(__file__).resolve().parents[3]
    return [root / "manifests" / "crd.yaml",
            root / "helm" / "tailcut" / "crds" / "trainingjobs.tailcut.dev.yaml"]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one JSON-schema node (see the module docstring)."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        # Sibling keywords (a field's own description) win over the referenced model's.
        target.update({k: v for k, v in node.items() if k != "$ref"})
        return _structural(target, defs)
    alternatives = node.get("anyOf") or node.get("oneOf")
    if alternatives is not None:
        return _union(node, [_structural(a, defs) for a in alternatives])
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _structural(v, defs) for name, v in value.items()}
        elif key in ("items",):
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        else:
            out[key] = copy.deepcopy(value)
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(node["additionalProperties"], defs)
    if "enum" in out and "type" not in out:
        out["type"] = _type_of(out["enum"][0])
    if "default" in out and not _fits(out["default"], out.get("type")):
        del out["default"]
    if out.get("default") is None and "default" in out:
        del out["default"]
    return out


def _union(node: dict[str, Any], alternatives: list[dict[str, Any]]) -> dict[str, Any]:
    real = [a for a in alternatives if a.get("type") != "null"]
    nullable = len(real) < len(alternatives)
    if len(real) == 1:
        merged = dict(real[0])
    else:
        merged = {"type": "object", "properties": {}}
        for alt in real:
            for name, prop in alt.get("properties", {}).items():
                seen = merged["properties"].get(name)
                if seen is not None and "enum" in seen and "enum" in prop:
                    seen["enum"] = seen["enum"] + [v for v in prop["enum"]
                                                   if v not in seen["enum"]]
                elif seen is None:
                    merged["properties"][name] = dict(prop)
    for key in ("description", "default"):
        if key in node and key not in merged:
            merged[key] = node[key]
    if nullable:
        merged["nullable"] = True
        merged.pop("default", None)
    return {k: v for k, v in merged.items() if k not in _DROP}


def _default_empty_sections(node: dict[str, Any]) -> None:
    """Give every nested section (an object with properties) `default: {}`, so the API
    server fills in the defaults inside it even when the section is left out, and
    `kubectl get` shows the transport a job really uses."""
    for child in node.get("properties", {}).values():
        if child.get("type") == "object" and "properties" in child:
            if not child.get("nullable"):
                child.setdefault("default", {})
            _default_empty_sections(child)


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = schema
    for part in path:
        node = node.get("properties", {}).get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _fits(value: Any, type_name: Any) -> bool:
    kinds = _TYPES.get(type_name)
    if kinds is None:
        return False
    return isinstance(value, kinds) and not (type_name != "boolean" and isinstance(value, bool))
