//! `granary operator`: the Kubernetes operator. It hosts the dispatcher, reconciles
//! `InputPipeline`s into worker Deployments, and sizes them; one replica leads.

use crate::exit::InvalidInput;
use anyhow::Context;
use granary_crds::WorkersSpec;
use granary_operator::credentials::SecurityOptions;
use granary_operator::{OperatorConfig, OperatorError, OperatorOptions, WorkerSettings};
use k8s_openapi::api::core::v1::ResourceRequirements;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `granary operator`.
#[derive(clap::Args, Clone, Debug)]
pub struct OperatorArgs {
    /// Address the dispatcher's gRPC API listens on.
    #[arg(long, env = "GRANARY_DISPATCHER_LISTEN", default_value = "0.0.0.0:7070")]
    pub dispatcher_listen: SocketAddr,
    /// `host:port` workers dial for the dispatcher (default:
    /// `granary-dispatcher.<lease namespace>.svc:7070`, the chart's Service).
    #[arg(long, env = "GRANARY_DISPATCHER_ADVERTISE")]
    pub dispatcher_advertise: Option<String>,
    /// Object-store URL of the dispatcher's journal, so a new leader resumes every epoch where
    /// it was (`s3://bucket/granary/journal`).
    #[arg(long, env = "GRANARY_JOURNAL")]
    pub journal: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on ADDR.
    #[arg(long, env = "GRANARY_METRICS_ADDR", default_value = "0.0.0.0:9090", value_name = "ADDR")]
    pub metrics_addr: SocketAddr,
    /// Watch only these namespaces, comma-separated or the flag repeated (default: every
    /// namespace).
    #[arg(long, env = "GRANARY_WATCH_NAMESPACE", value_delimiter = ',')]
    pub namespace: Vec<String>,
    /// Namespace of the leader Lease (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "granary-operator")]
    pub lease_name: String,
    /// This replica's name in the election and in Events (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Image of the worker pods (holding `granary`).
    #[arg(long, env = "GRANARY_WORKER_IMAGE")]
    pub worker_image: String,
    /// Image of the worker pods of pipelines with `python.map` stages (and no
    /// `spec.workers.image`): one with Python and NumPy. Default: the worker image's repository
    /// with `-python` appended, same tag.
    #[arg(long, env = "GRANARY_WORKER_PYTHON_IMAGE")]
    pub worker_python_image: Option<String>,
    /// `imagePullPolicy` of the worker pods.
    #[arg(long, env = "GRANARY_WORKER_IMAGE_PULL_POLICY")]
    pub worker_image_pull_policy: Option<String>,
    /// Requests and limits of each worker, as a Kubernetes ResourceRequirements in JSON
    /// (`{"requests":{"cpu":"1","memory":"1Gi"}}`).
    #[arg(long, env = "GRANARY_WORKER_RESOURCES")]
    pub worker_resources: Option<String>,
    /// Pod settings every pipeline's workers start from, in `spec.workers`' JSON shape without
    /// `image` and `resources` (`{"nodeSelector":{"pool":"cpu"},"tolerations":[...]}`); each
    /// pipeline's `spec.workers` is merged over them. The chart's `workers.pod`.
    #[arg(long, env = "GRANARY_WORKER_POD_DEFAULTS")]
    pub worker_pod_defaults: Option<String>,
    /// Secret whose keys become the workers' environment (object-store credentials); looked up
    /// in each pipeline's namespace, optional there.
    #[arg(long, env = "GRANARY_WORKER_ENV_SECRET")]
    pub worker_env_secret: Option<String>,
    /// Seconds between autoscaling evaluations.
    #[arg(long, default_value_t = 10.0)]
    pub policy_period: f64,
    /// Seconds listing a pipeline's source and counting its elements may take before the
    /// registration fails (reported as `SourceUnavailable`, retried).
    #[arg(long, env = "GRANARY_COUNT_BUDGET", default_value_t = 60.0, value_name = "SECONDS")]
    pub count_budget: f64,
    /// Secure the gRPC plane: TLS on every link and a credential on every call. The CA and the
    /// master key live in Secrets of the operator's namespace; each pipeline gets a worker
    /// Secret its pods mount and a trainer Secret (`<name>-granary-trainer`) trainers read.
    #[arg(long, env = "GRANARY_SECURITY")]
    pub security: bool,
    /// With `--security`: the Secret holding the CA (`tls.crt`, `tls.key`, `ca.crt`).
    #[arg(long, env = "GRANARY_CA_SECRET", default_value = "granary-ca")]
    pub ca_secret: String,
    /// With `--security`: the Secret holding the master key tokens derive from.
    #[arg(long, env = "GRANARY_AUTH_SECRET", default_value = "granary-auth")]
    pub auth_secret: String,
    /// With `--security`: cert-manager makes and renews the CA Secret; the operator only reads it.
    #[arg(long, env = "GRANARY_EXTERNAL_CA")]
    pub external_ca: bool,
    /// With `--security`: more names the dispatcher's certificate serves, comma-separated,
    /// besides the host of `--dispatcher-advertise` (the chart adds its Service's names).
    #[arg(long, env = "GRANARY_DISPATCHER_NAMES", value_delimiter = ',')]
    pub dispatcher_names: Vec<String>,
}

impl OperatorArgs {
    fn options(&self) -> anyhow::Result<OperatorOptions> {
        let some = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        let resources = some(&self.worker_resources)
            .map(|json| serde_json::from_str::<ResourceRequirements>(&json))
            .transpose()
            .map_err(|e| {
                InvalidInput(format!(
                    "--worker-resources must be a ResourceRequirements in JSON, e.g. \
                     {{\"requests\":{{\"cpu\":\"1\"}}}} ({e})"
                ))
            })?;
        let pod_defaults = match some(&self.worker_pod_defaults) {
            None => WorkersSpec::default(),
            Some(json) => {
                let defaults: WorkersSpec = serde_json::from_str(&json).map_err(|e| {
                    InvalidInput(format!(
                        "--worker-pod-defaults (chart value `workers.pod`) must be spec.workers' fields in JSON, \
                         e.g. {{\"nodeSelector\":{{\"pool\":\"cpu\"}}}} ({e})"
                    ))
                })?;
                let problems = defaults.problems_as_defaults("--worker-pod-defaults");
                if !problems.is_empty() {
                    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
                    return Err(InvalidInput(text.join("; ")).into());
                }
                defaults
            }
        };
        let policy_period =
            Duration::try_from_secs_f64(self.policy_period).ok().filter(|p| !p.is_zero()).ok_or_else(
                || InvalidInput("--policy-period must be a positive number of seconds".to_string()),
            )?;
        if self.worker_image.trim().is_empty() {
            return Err(InvalidInput(
                "--worker-image (GRANARY_WORKER_IMAGE) is empty; name the image holding granary".to_string(),
            )
            .into());
        }
        let identity = some(&self.identity)
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("granary-operator-{}", std::process::id()));
        let dispatcher = some(&self.dispatcher_advertise)
            .unwrap_or_else(|| format!("granary-dispatcher.{}.svc:7070", self.lease_namespace));
        Ok(OperatorOptions {
            dispatcher_listen: self.dispatcher_listen,
            journal: some(&self.journal),
            metrics_addr: self.metrics_addr,
            namespaces: watched(&self.namespace),
            lease_namespace: self.lease_namespace.clone(),
            lease_name: self.lease_name.clone(),
            identity,
            security: self.security.then(|| self.security_options(&dispatcher)),
            config: OperatorConfig {
                workers: WorkerSettings {
                    image: self.worker_image.clone(),
                    image_pull_policy: some(&self.worker_image_pull_policy),
                    resources,
                    env_secret: some(&self.worker_env_secret),
                    dispatcher,
                    python_image: some(&self.worker_python_image),
                    pod_defaults,
                },
                policy_period,
                status_period: Duration::from_secs(10),
            },
        })
    }
}

impl OperatorArgs {
    /// The security settings: the dispatcher's certificate names the host workers dial
    /// (`advertise`), and the names given.
    fn security_options(&self, advertise: &str) -> SecurityOptions {
        let host = match advertise.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => advertise,
        };
        let mut hosts = vec![host.trim_matches(['[', ']']).to_string()];
        hosts.extend(watched(&self.dispatcher_names));
        hosts.dedup();
        SecurityOptions {
            ca_secret: self.ca_secret.clone(),
            key_secret: self.auth_secret.clone(),
            manage_ca: !self.external_ca,
            dispatcher_hosts: hosts,
        }
    }
}

/// The namespaces to watch: the flag's values trimmed, empty ones dropped, each once (in order).
fn watched(namespaces: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for namespace in namespaces.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if !out.iter().any(|seen| seen == namespace) {
            out.push(namespace.to_string());
        }
    }
    out
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub fn operator(args: &OperatorArgs) -> anyhow::Result<ExitCode> {
    let options = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("granary-operator")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let budget =
        Duration::try_from_secs_f64(args.count_budget).ok().filter(|b| !b.is_zero()).ok_or_else(|| {
            InvalidInput(
                "--count-budget (GRANARY_COUNT_BUDGET) must be a positive number of seconds".to_string(),
            )
        })?;
    let catalog = Arc::new(crate::local::catalog::WorkerCatalog { budget });
    let bound = |dispatcher: SocketAddr, metrics: SocketAddr| {
        println!(
            "{}",
            serde_json::json!({"dispatcher": dispatcher.to_string(), "metrics": metrics.to_string()})
        );
    };
    let result =
        runtime.block_on(granary_operator::run(options, catalog, bound, super::worker::shutdown_signal()));
    runtime.shutdown_timeout(Duration::from_secs(2));
    if let Err(OperatorError::Renew) = result {
        // Kubernetes starts it again, with a fresh certificate.
        tracing::info!("{}", OperatorError::Renew);
        return Ok(ExitCode::SUCCESS);
    }
    result.context("operator stopped")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn parse(flags: &[&str]) -> anyhow::Result<OperatorOptions> {
        let args = Cli::try_parse_from([&["granary", "--worker-image", "img:1"][..], flags].concat())?.args;
        args.options()
    }

    #[test]
    fn defaults_point_workers_at_the_charts_service() {
        let o = parse(&["--lease-namespace", "granary"]).unwrap();
        assert_eq!(o.config.workers.dispatcher, "granary-dispatcher.granary.svc:7070");
        assert_eq!(o.dispatcher_listen.port(), 7070);
        assert_eq!(o.config.workers.image, "img:1");
        assert!(o.namespaces.is_empty() && o.journal.is_none() && o.config.workers.resources.is_none());
        assert!(o.security.is_none(), "plaintext unless asked");
    }

    #[test]
    fn worker_pod_defaults_are_parsed_and_checked() {
        let o = parse(&["--worker-pod-defaults", r#"{"nodeSelector":{"pool":"cpu"}}"#]).unwrap();
        assert_eq!(o.config.workers.pod_defaults.node_selector["pool"], "cpu");
        let e = parse(&["--worker-pod-defaults", "{nope"]).unwrap_err().to_string();
        assert!(e.contains("--worker-pod-defaults") && e.contains("nodeSelector"), "{e}");
        let e = parse(&["--worker-pod-defaults", r#"{"env":[{"name":"GRANARY_DISPATCHER","value":"x"}]}"#])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--worker-pod-defaults.env[0].name: "), "{e}");
        let e = parse(&["--worker-pod-defaults", r#"{"image":"x:1"}"#]).unwrap_err().to_string();
        assert!(e.contains("workers.image"), "{e}");
    }

    #[test]
    fn security_names_the_advertised_host_and_the_services_names() {
        let o =
            parse(&["--lease-namespace", "g", "--security", "--dispatcher-names", "granary-dispatcher, x"])
                .unwrap();
        let s = o.security.unwrap();
        assert_eq!(s.dispatcher_hosts, ["granary-dispatcher.g.svc", "granary-dispatcher", "x"]);
        assert!(s.manage_ca);
        assert_eq!((s.ca_secret.as_str(), s.key_secret.as_str()), ("granary-ca", "granary-auth"));
        let o = parse(&["--security", "--external-ca", "--dispatcher-advertise", "127.0.0.1:7070"]).unwrap();
        let s = o.security.unwrap();
        assert_eq!(s.dispatcher_hosts, ["127.0.0.1"]);
        assert!(!s.manage_ca);
    }

    #[test]
    fn namespaces_are_a_list_comma_separated_or_repeated() {
        let o = parse(&["--namespace", "a"]).unwrap();
        assert_eq!(o.namespaces, ["a"]);
        let o = parse(&["--namespace", "a, b,,a", "--namespace", "c"]).unwrap();
        assert_eq!(o.namespaces, ["a", "b", "c"]);
        let o = parse(&["--namespace", ""]).unwrap();
        assert!(o.namespaces.is_empty(), "an empty value (the chart's unset one) watches every namespace");
    }

    #[test]
    fn worker_resources_are_read_as_json_and_bad_ones_say_how() {
        let o = parse(&["--worker-resources", r#"{"requests":{"cpu":"2"}}"#]).unwrap();
        let requests = o.config.workers.resources.unwrap().requests.unwrap();
        assert_eq!(requests["cpu"].0, "2");
        let e = format!("{:#}", parse(&["--worker-resources", "cpu=2"]).unwrap_err());
        assert!(e.contains("--worker-resources must be a ResourceRequirements in JSON"), "{e}");
        let e = parse(&["--policy-period", "0"]).unwrap_err().to_string();
        assert!(e.contains("--policy-period"), "{e}");
    }
}
