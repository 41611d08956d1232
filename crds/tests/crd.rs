//! The generated CustomResourceDefinition: names, version, subresources, printer columns, a
//! structural schema, CEL rules, and a description on every property (`kubectl explain` text).

use granary_crds::InputPipeline;
use kube::CustomResourceExt;
use serde_json::Value;

fn crd_json() -> Value {
    serde_json::to_value(InputPipeline::crd()).unwrap()
}

fn schema() -> Value {
    crd_json().pointer("/spec/versions/0/schema/openAPIV3Schema").cloned().unwrap()
}

#[test]
fn names_version_and_subresources() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "inputpipelines.granary.dev");
    assert_eq!(crd["spec"]["group"], "granary.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], "InputPipeline");
    assert_eq!(crd["spec"]["names"]["plural"], "inputpipelines");
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    let v = &versions[0];
    assert_eq!(v["name"], "v1alpha1");
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert!(v["subresources"]["status"].is_object(), "{v:#}");
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for c in ["Phase", "Workers", "Throughput", "Wait", "Cache", "Epoch", "Age"] {
        assert!(columns.contains(&c), "missing printer column {c}: {columns:?}");
    }
}

#[test]
fn yaml_round_trips() {
    let yaml = serde_norway::to_string(&InputPipeline::crd()).unwrap();
    let back: Value = serde_norway::from_str(&yaml).unwrap();
    assert_eq!(back, crd_json());
}

#[test]
fn stage_items_preserve_unknown_fields() {
    let items = schema().pointer("/properties/spec/properties/stages/items").cloned().unwrap();
    assert_eq!(items["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(items["type"], "object");
    assert_eq!(items["required"], serde_json::json!(["op"]));
}

#[test]
fn max_bytes_is_int_or_string() {
    let max = schema().pointer("/properties/spec/properties/cache/properties/maxBytes").cloned().unwrap();
    assert_eq!(max["x-kubernetes-int-or-string"], true);
    assert!(max.get("anyOf").is_none() && max.get("type").is_none(), "{max:#}");
}

fn rules(path: &str) -> Vec<String> {
    schema()
        .pointer(path)
        .and_then(|s| s.get("x-kubernetes-validations"))
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|r| r["rule"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn cel_rules() {
    let scaling = rules("/properties/spec/properties/scaling");
    assert!(scaling.iter().any(|r| r.contains("has(self.replicas)")), "{scaling:?}");
    assert!(scaling.iter().any(|r| r.contains("self.minWorkers <= self.maxWorkers")), "{scaling:?}");
    let cache = rules("/properties/spec/properties/cache");
    assert!(cache.iter().any(|r| r.contains("has(self.at)")), "{cache:?}");
    assert!(cache.iter().any(|r| r.contains("has(self.store)")), "{cache:?}");
    let source = rules("/properties/spec/properties/source");
    assert!(source.iter().any(|r| r.contains("self.format == 'files'")), "{source:?}");
    for (path, list) in [("scaling", &scaling), ("cache", &cache), ("source", &source)] {
        let all = schema()
            .pointer(&format!("/properties/spec/properties/{path}/x-kubernetes-validations"))
            .cloned();
        for rule in all.unwrap().as_array().unwrap() {
            assert!(
                rule["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{path}: {rule} without message"
            );
        }
        assert!(!list.is_empty());
    }
}

/// Walks every schema node: structural rules (no `$ref`, no `definitions`, `anyOf`/`oneOf`/`allOf`
/// only without types inside, every node with a `type` unless int-or-string or
/// preserve-unknown-fields, arrays with `items`) and a non-empty `description` on every property.
fn walk(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        errors.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in ["$ref", "definitions", "$defs", "$schema", "additionalItems", "patternProperties"] {
        if obj.contains_key(forbidden) {
            errors.push(format!("{path}: has `{forbidden}`"));
        }
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = obj.get(combinator).and_then(Value::as_array) {
            for (i, sub) in list.iter().enumerate() {
                for key in ["type", "description", "default", "nullable", "additionalProperties"] {
                    if sub.get(key).is_some() {
                        errors.push(format!("{path}.{combinator}[{i}]: sets `{key}`"));
                    }
                }
            }
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !obj.contains_key("type") && !int_or_string && !preserve {
        errors.push(format!("{path}: has no `type`"));
    }
    if obj.get("type") == Some(&Value::String("array".into())) && !obj.contains_key("items") {
        errors.push(format!("{path}: array without `items`"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if obj.get("type") != Some(&Value::String("object".into())) {
            errors.push(format!("{path}: has properties but is not `type: object`"));
        }
        for (name, sub) in props {
            let sub_path = format!("{path}.{name}");
            if sub.get("description").and_then(Value::as_str).is_none_or(|d| d.trim().is_empty()) {
                errors.push(format!("{sub_path}: no description"));
            }
            walk(sub, &sub_path, errors);
        }
    }
    if let Some(items) = obj.get("items") {
        walk(items, &format!("{path}[]"), errors);
    }
    if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        walk(extra, &format!("{path}{{}}"), errors);
    }
}

#[test]
fn schema_is_structural_and_fully_described() {
    let mut errors = Vec::new();
    walk(&schema(), "", &mut errors);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn walk_catches_missing_descriptions() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"anyOf": [{"type": "integer"}]}}
    });
    let mut errors = Vec::new();
    walk(&bad, "", &mut errors);
    assert_eq!(errors.len(), 4, "{errors:?}");
}
