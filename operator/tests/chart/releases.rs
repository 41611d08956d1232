//! Releases side by side, and the operator's settings the chart passes through: every name of a
//! release derives from the release name, so several releases fit in one namespace (and cluster);
//! the log level and format, `extraEnv` and `extraArgs`; the PodDisruptionBudget.

use super::*;

/// `(kind, namespace, name)` of every object a render holds.
fn identities(docs: &[Value]) -> BTreeSet<(String, String, String)> {
    docs.iter()
        .map(|d| {
            let namespace = d["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            (kind_of(d).to_string(), namespace, name_of(d).to_string())
        })
        .collect()
}

/// The argument after `flag` in the operator container's args.
fn arg_after<'a>(docs: &'a [Value], flag: &str) -> Option<&'a str> {
    let deployment = one(docs, "Deployment", None);
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array()?;
    args.windows(2).find(|w| w[0] == flag).and_then(|w| w[1].as_str())
}

#[test]
fn two_releases_in_one_namespace_share_no_name_but_the_crd() {
    let first = documents(&template("granary", &["--include-crds"]));
    let second = documents(&template("team-b", &["--include-crds"]));
    let (a, b) = (identities(&first), identities(&second));
    let shared: Vec<_> = a.intersection(&b).collect();
    assert_eq!(
        shared,
        [&("CustomResourceDefinition".to_string(), String::new(), "inputpipelines.granary.dev".to_string())],
        "objects both releases would own"
    );
    // What the objects refer to by name follows: the Lease, the Secrets, the advertised address.
    for (docs, full) in [(&first, "granary"), (&second, "team-b-granary")] {
        assert_eq!(arg_after(docs, "--lease-name"), Some(format!("{full}-operator").as_str()));
        assert_eq!(operator_env(docs, "GRANARY_CA_SECRET"), Some(format!("{full}-ca").as_str()));
        assert_eq!(operator_env(docs, "GRANARY_AUTH_SECRET"), Some(format!("{full}-auth").as_str()));
        let address = format!("{full}-dispatcher.{NAMESPACE}.svc:7070");
        assert_eq!(operator_env(docs, "GRANARY_DISPATCHER_ADVERTISE"), Some(address.as_str()));
        let service = one(docs, "Service", Some(&format!("{full}-dispatcher")));
        assert_eq!(
            service["spec"]["selector"]["app.kubernetes.io/instance"],
            full.trim_end_matches("-granary")
        );
    }
    // The release `granary` keeps the names of earlier versions of the chart.
    one(&first, "Service", Some("granary-dispatcher"));
    assert_eq!(arg_after(&first, "--lease-name"), Some("granary-operator"));
}

#[test]
fn a_long_release_name_still_gives_dns_label_names() {
    // The longest name Helm takes (53): its full name, `<release>-granary`, is cut to 55.
    let release = "a-release-name-that-is-much-longer-than-anyone-choose";
    assert_eq!(release.len(), 53);
    let docs = documents(&template(release, &[]));
    for doc in docs.iter().filter(|d| kind_of(d) == "Service") {
        let name = name_of(doc);
        assert!(name.len() <= 63 && !name.ends_with('-'), "Service name {name:?} is no DNS label");
    }
    let advertise = operator_env(&docs, "GRANARY_DISPATCHER_ADVERTISE").expect("the advertised address");
    let service = advertise.split('.').next().unwrap_or_default();
    one(&docs, "Service", Some(service));
}

#[test]
fn log_settings_extra_env_and_extra_args_reach_the_operator() {
    let docs = render_defaults();
    assert_eq!(operator_env(&docs, "GRANARY_LOG"), Some("info"));
    assert_eq!(operator_env(&docs, "GRANARY_LOG_FORMAT"), Some("text"));

    let docs = render_everything();
    assert_eq!(operator_env(&docs, "GRANARY_LOG"), Some("granary_operator=debug,info"));
    assert_eq!(operator_env(&docs, "GRANARY_LOG_FORMAT"), Some("json"));
    assert_eq!(operator_env(&docs, "HTTPS_PROXY"), Some("http://proxy.example.com:3128"));
    let deployment = one(&docs, "Deployment", None);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().expect("env");
    let extra = env.iter().find(|e| e["name"] == "GRANARY_EXTRA_TOKEN").expect("extraEnv's valueFrom");
    assert_eq!(extra["valueFrom"]["secretKeyRef"]["key"], "token");
    let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a variable set twice: {names:?}");
    // After the chart's own arguments, so a flag given there wins over the chart's env.
    let args = container["args"].as_array().expect("args");
    assert_eq!(args[args.len() - 2..], [json!("--count-budget"), json!("120")], "{args:?}");

    let out =
        output(Command::new(helm_bin()).args(["template", "g", "charts/granary", "--set", "logFormat=xml"]));
    assert!(!out.status.success() && describe(&out).contains("logFormat"), "{}", describe(&out));
}

#[test]
fn the_pod_disruption_budget_selects_the_operator_pods_and_follows_the_server_version() {
    assert!(!render_defaults().iter().any(|d| kind_of(d) == "PodDisruptionBudget"), "off by default");
    let docs = render_everything();
    let budget = one(&docs, "PodDisruptionBudget", None);
    let deployment = one(&docs, "Deployment", None);
    assert_eq!(budget["apiVersion"], "policy/v1");
    assert_eq!(budget["spec"]["selector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"]);
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert!(budget["spec"].get("minAvailable").is_none());

    let on = ["--set", "podDisruptionBudget.enabled=true"];
    let docs = documents(&template(
        "granary",
        &[
            &on[..],
            &[
                "--set",
                "podDisruptionBudget.minAvailable=50%",
                "--set",
                "podDisruptionBudget.maxUnavailable=null",
            ],
        ]
        .concat(),
    ));
    let budget = one(&docs, "PodDisruptionBudget", None);
    assert_eq!(
        (&budget["spec"]["minAvailable"], budget["spec"].get("maxUnavailable")),
        (&json!("50%"), None)
    );
    let policy = ["--set", "podDisruptionBudget.unhealthyPodEvictionPolicy=AlwaysAllow"];
    let docs = documents(&template("granary", &[&on[..], &policy[..]].concat()));
    assert_eq!(one(&docs, "PodDisruptionBudget", None)["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");

    let old = ["--kube-version", "1.20.0"];
    let docs = documents(&template("granary", &[&on[..], &old[..]].concat()));
    assert_eq!(one(&docs, "PodDisruptionBudget", None)["apiVersion"], "policy/v1beta1");
    for bad in [
        &[&on[..], &old[..], &policy[..]].concat(),
        &[&on[..], &["--set", "podDisruptionBudget.minAvailable=1"]].concat(),
    ] {
        let out = output(Command::new(helm_bin()).args(["template", "g", "charts/granary"]).args(bad));
        assert!(!out.status.success(), "helm rendered {bad:?}");
        assert!(describe(&out).contains("podDisruptionBudget"), "{}", describe(&out));
    }
}
