"""The CRD is generated from the spec models; the checked-in copies must not drift."""

from tailcut.k8s.manifests import crd


def test_checked_in_crds_match_the_spec_models():
    expected = crd.render()
    for path in crd.checked_in_paths():
        assert path.read_text() == expected, (
            f"{path} drifted from tailcut/spec/model.py: run `tailcut crd --write`")


def test_spec_schema_is_structural():
    """Every node has a type, and no $ref, anyOf, oneOf or title is left."""
    def walk(node, where):
        assert "type" in node, f"{where}: no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "const"):
            assert banned not in node, f"{where}: {banned}"
        for name, child in node.get("properties", {}).items():
            walk(child, f"{where}.{name}")
        if "items" in node:
            walk(node["items"], f"{where}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{where}{{}}")
    walk(crd.spec_schema(), "spec")
    walk(crd.status_schema(), "status")


def test_validator_checked_choices_become_enums():
    schema = crd.spec_schema()
    from tailcut.ml import models
    assert schema["properties"]["training"]["properties"]["model"]["enum"] == [
        *models.names(), "torch-mlp", "torch-cnn", "torch"]
    assert schema["properties"]["transport"]["properties"]["type"]["enum"] == [
        "tcp", "udp", "bounded-loss", "app-drop"]
    assert schema["properties"]["training"]["properties"]["syncMode"]["enum"] == [
        "bsp", "async", "ssp", "allreduce"]
    assert schema["properties"]["scheduling"]["properties"]["policy"]["enum"] == [
        "fair", "coflow", "cadentflow"]
    sizes = schema["properties"]["backgroundLoad"]["properties"]["flowSizes"]["properties"]
    assert sizes["distribution"]["enum"] == ["web-search", "data-mining", "fixed"]


def test_optional_fields_become_nullable_and_bounds_carry_over():
    training = crd.spec_schema()["properties"]["training"]["properties"]
    assert training["targetAccuracy"]["nullable"] is True
    assert training["targetAccuracy"]["maximum"] == 1.0
    assert training["learningRate"]["exclusiveMinimum"] is True
    assert crd.spec_schema()["properties"]["replicas"]["properties"]["workers"]["minimum"] == 1


def test_a_tagged_union_of_transports_becomes_one_object_with_every_field():
    """The transport section is about to grow variants (bounded-loss with p, ...)."""
    node = {"oneOf": [
        {"type": "object", "properties": {"type": {"const": "tcp"}}},
        {"type": "object", "properties": {"type": {"const": "bounded-loss"},
                                          "p": {"type": "number", "minimum": 0,
                                                "maximum": 1}}}]}
    merged = crd._structural(node, {})
    assert merged["type"] == "object"
    assert merged["properties"]["type"]["enum"] == ["tcp", "bounded-loss"]
    assert merged["properties"]["p"]["maximum"] == 1


def test_printer_columns_show_phase_transport_p_progress_jct_and_age():
    names = [c["name"] for c in crd.PRINTER_COLUMNS]
    for wanted in ("Phase", "Transport", "P", "Progress", "JCT-s", "Age"):
        assert wanted in names


def test_tailcut_crd_prints_the_definition(capsys):
    import yaml

    from tailcut import cli
    assert cli.main(["crd"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["kind"] == "CustomResourceDefinition"
    assert printed["metadata"]["name"] == "trainingjobs.tailcut.dev"
