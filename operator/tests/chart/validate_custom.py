#!/usr/bin/env python3
"""Validates custom resources against the openAPIV3Schema of their CustomResourceDefinitions.

    validate_custom.py --crd CRD.yaml [--crd CRD.yaml ...] DOCS.yaml [DOCS.yaml ...]

Prints one JSON line per document of the DOCS files:
    {"file": ..., "index": i, "apiVersion": ..., "kind": ..., "name": ...,
     "errors": [{"path": "spec.batch.size", "message": ...}, ...], "celRulesNotChecked": n}
and exits 0 when every document is valid, 1 when one is not, 2 on a usage problem (a document
whose kind and version no CRD serves, an unreadable file, missing Python packages).

The structural schema is turned into a JSON Schema (draft 4, the dialect OpenAPI 3.0 builds on)
the way the API server reads it, with kubectl's strict field validation:
  - `nullable: true` admits null;
  - `x-kubernetes-int-or-string: true` admits an integer or a string;
  - an object with `properties` rejects unknown fields, unless it has
    `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties` (the API server would
    prune them silently; kubectl --validate=strict, the default since 1.25, rejects them);
  - `apiVersion`, `kind` and `metadata` are implicit at the root and in embedded resources;
  - `format` is not checked (the API server checks few formats; most are informational).
`x-kubernetes-validations` (CEL rules) are not evaluated, only counted in `celRulesNotChecked`.
Used by operator/tests/chart.rs, with the Python of the venv scripts/test creates.
"""

import argparse
import copy
import json
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover - depends on the environment
    print(
        f"validate_custom.py needs the Python packages jsonschema and PyYAML ({e}); "
        "run scripts/test, which installs them in target/tools/venv",
        file=sys.stderr,
    )
    sys.exit(2)


def to_json_schema(schema, root=False):
    """Returns (JSON Schema, number of CEL rules found) for a structural OpenAPI v3 schema."""
    if not isinstance(schema, dict):
        return schema, 0
    s = copy.copy(schema)
    cel = len(s.pop("x-kubernetes-validations", None) or [])
    s.pop("format", None)
    nullable = s.pop("nullable", False)
    preserve = s.pop("x-kubernetes-preserve-unknown-fields", False)
    embedded = s.pop("x-kubernetes-embedded-resource", False)
    int_or_string = s.pop("x-kubernetes-int-or-string", False)
    for key in [k for k in s if k.startswith("x-kubernetes-")]:
        del s[key]

    if "properties" in s:
        props = {}
        for name, sub in s["properties"].items():
            props[name], n = to_json_schema(sub)
            cel += n
        s["properties"] = props
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"], n = to_json_schema(s["additionalProperties"])
        cel += n
    if isinstance(s.get("items"), dict):
        s["items"], n = to_json_schema(s["items"])
        cel += n
    for key in ("allOf", "anyOf", "oneOf"):
        if key in s:
            subs = []
            for sub in s[key]:
                sub, n = to_json_schema(sub)
                cel += n
                subs.append(sub)
            s[key] = subs
    if "not" in s:
        s["not"], n = to_json_schema(s["not"])
        cel += n

    if root or embedded:
        props = s.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if (
        s.get("type") == "object"
        and "properties" in s
        and "additionalProperties" not in s
        and not preserve
    ):
        s["additionalProperties"] = False

    if int_or_string:
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}] + ([{"type": "null"}] if nullable else [])
    elif nullable:
        # Keywords other than `type` and `enum` constrain only their own types, so null passes them.
        if isinstance(s.get("type"), str):
            s["type"] = [s["type"], "null"]
        if "enum" in s:
            s["enum"] = list(s["enum"]) + [None]
    return s, cel


def load_documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def crd_schemas(paths):
    """(group, version, kind) -> (JSON Schema, CEL rule count) for every served CRD version."""
    schemas = {}
    for path in paths:
        for crd in load_documents(path):
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                if not version.get("served", False):
                    continue
                structural = version["schema"]["openAPIV3Schema"]
                key = (spec["group"], version["name"], spec["names"]["kind"])
                schemas[key] = to_json_schema(structural, root=True)
    return schemas


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crd", action="append", required=True, help="a CRD file")
    parser.add_argument("docs", nargs="+", help="files of custom resources")
    args = parser.parse_args()

    try:
        schemas = crd_schemas(args.crd)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        print(f"cannot read the CRDs {args.crd}: {e!r}", file=sys.stderr)
        return 2

    invalid = False
    for path in args.docs:
        try:
            docs = load_documents(path)
        except (OSError, yaml.YAMLError) as e:
            print(f"cannot read {path}: {e}", file=sys.stderr)
            return 2
        for index, doc in enumerate(docs):
            api_version = doc.get("apiVersion", "")
            group, _, version = api_version.rpartition("/")
            kind = doc.get("kind", "")
            name = (doc.get("metadata") or {}).get("name")
            if (group, version, kind) not in schemas:
                print(f"{path} #{index}: no CRD given serves {kind} {api_version}", file=sys.stderr)
                return 2
            schema, cel = schemas[(group, version, kind)]
            validator = jsonschema.Draft4Validator(schema)
            errors = [
                {"path": ".".join(str(p) for p in e.absolute_path), "message": e.message}
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
            ]
            if not name and not (doc.get("metadata") or {}).get("generateName"):
                errors.append({"path": "metadata.name", "message": "metadata.name is required"})
            invalid |= bool(errors)
            print(json.dumps({
                "file": path,
                "index": index,
                "apiVersion": api_version,
                "kind": kind,
                "name": name,
                "errors": errors,
                "celRulesNotChecked": cel,
            }))
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
