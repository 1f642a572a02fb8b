//! The Helm chart (`deployments/helm/gpushare-dra`) rendered by the real helm with values other
//! than its defaults (the defaults' rendering is `deployments/*.yaml`, which
//! `dra/tests/manifests.rs` checks and `deployments/render.sh --check` compares): each value
//! changes what it says and nothing else is left inconsistent, and a bad value is refused by
//! the chart's schema before anything is rendered.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::PathBuf;
use std::process::{Command, Output};

use gpushare_e2e::cluster::repo;
use gpushare_e2e::release::helm;
use serde::Deserialize;
use serde_json::Value;

/// `helm template gpushare-dra CHART --namespace NS ARGS`.
fn template(helm: &PathBuf, ns: &str, args: &[&str]) -> Output {
    Command::new(helm)
        .args(["template", "gpushare-dra"])
        .arg(repo().join("deployments/helm/gpushare-dra"))
        .args(["--namespace", ns])
        .args(args)
        .output()
        .unwrap()
}

/// The rendered objects.
fn objects(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn another_driver_name_and_namespace_reach_every_object_that_names_them() {
    let Some(helm) = helm() else { return };
    let objs = objects(&template(
        &helm,
        "gpu-sharing",
        &["--set", "driverName=gpushare.example.com"],
    ));
    let ds = of_kind(&objs, "DaemonSet")[0];
    assert_eq!(ds["metadata"]["namespace"], "gpu-sharing");
    let args = &ds["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[0], "--driver-name=gpushare.example.com");
    for class in of_kind(&objs, "DeviceClass") {
        let expr = class["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        assert!(
            expr.starts_with("device.driver == 'gpushare.example.com' && device.attributes['gpushare.example.com'].type == "),
            "{expr}"
        );
    }
    // The admission policy matches the service account in the release's namespace.
    let vap = of_kind(&objs, "ValidatingAdmissionPolicy")[0];
    assert_eq!(
        vap["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == 'system:serviceaccount:gpu-sharing:gpushare-dra'"
    );
    let binding = of_kind(&objs, "ClusterRoleBinding")[0];
    assert_eq!(binding["subjects"][0]["namespace"], "gpu-sharing");
    // helm install puts the release in a namespace that exists: no Namespace object.
    assert!(of_kind(&objs, "Namespace").is_empty());
}

#[test]
fn metrics_off_leaves_no_endpoint_probe_or_network_policy_and_scrapers_are_admitted_by_name() {
    let Some(helm) = helm() else { return };
    let objs = objects(&template(
        &helm,
        "gpushare",
        &["--set", "metrics.enabled=false"],
    ));
    let c = &of_kind(&objs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0];
    assert!(c["args"]
        .as_array()
        .unwrap()
        .contains(&Value::from("--metrics-address=off")));
    for k in ["ports", "livenessProbe", "readinessProbe"] {
        assert!(c[k].is_null(), "{k}: {c}");
    }
    assert!(of_kind(&objs, "NetworkPolicy").is_empty());

    // The default: ingress to the pod denied but for the listed scrapers, on the metrics port.
    let objs = objects(&template(&helm, "gpushare", &[]));
    let np = of_kind(&objs, "NetworkPolicy")[0];
    assert_eq!(np["spec"]["ingress"], serde_json::json!([]));
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let objs = objects(&template(
        &helm,
        "gpushare",
        &[
            "--set",
            "metrics.port=9999",
            "--set-json",
            r#"metrics.networkPolicy.from=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
        ],
    ));
    let np = of_kind(&objs, "NetworkPolicy")[0];
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], 9999);
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
            ["kubernetes.io/metadata.name"],
        "monitoring"
    );
    let c = &of_kind(&objs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["ports"][0]["containerPort"], 9999);
    assert!(c["args"]
        .as_array()
        .unwrap()
        .contains(&Value::from("--metrics-address=0.0.0.0:9999")));
}

#[test]
fn the_image_the_node_selector_and_optional_objects_follow_their_values() {
    let Some(helm) = helm() else { return };
    let objs = objects(&template(
        &helm,
        "gpushare",
        &[
            "--set",
            "image.repository=123456789012.dkr.ecr.us-west-2.amazonaws.com/gpushare-dra",
            "--set",
            "deviceClasses.create=false",
            "--set",
            "admissionPolicy.enabled=false",
            "--set-json",
            r#"nodeSelector={"node.kubernetes.io/instance-type":"p5.48xlarge"}"#,
        ],
    ));
    let spec = &of_kind(&objs, "DaemonSet")[0]["spec"]["template"]["spec"];
    // The tag defaults to the chart's appVersion: the release's image.
    assert_eq!(
        spec["containers"][0]["image"],
        format!(
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/gpushare-dra:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    // Helm merges maps: the gpushared label stays beside the one added (`=null` drops it).
    assert_eq!(
        spec["nodeSelector"],
        serde_json::json!({
            "gpushare.io/gpushared": "true",
            "node.kubernetes.io/instance-type": "p5.48xlarge"
        })
    );
    assert!(of_kind(&objs, "DeviceClass").is_empty());
    assert!(of_kind(&objs, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&objs, "ValidatingAdmissionPolicyBinding").is_empty());
}

#[test]
fn a_misspelt_or_mistyped_value_is_refused_by_the_schema() {
    let Some(helm) = helm() else { return };
    for (args, words) in [
        (&["--set", "metric.enabled=false"][..], "metric"),
        (&["--set", "metrics.port=0"][..], "/metrics/port"),
        (&["--set", "driverName=GPU_Driver"][..], "/driverName"),
        (
            &["--set", "image.pullPolicy=Sometimes"][..],
            "/image/pullPolicy",
        ),
        // A NetworkPolicy peer that names nothing (the API server refuses it).
        (
            &["--set-json", "metrics.networkPolicy.from=[{}]"][..],
            "/metrics/networkPolicy/from/0",
        ),
        (
            &["--set", "deviceClasses.names.gpu=GPU_Class"][..],
            "/deviceClasses/names/gpu",
        ),
        // Not an extended resource name: no domain, or Kubernetes' own.
        (
            &["--set", "deviceClasses.extendedResourceName=gpu"][..],
            "/deviceClasses/extendedResourceName",
        ),
        (
            &[
                "--set",
                "deviceClasses.extendedResourceName=kubernetes.io/gpu",
            ][..],
            "/deviceClasses/extendedResourceName",
        ),
    ] {
        let out = template(&helm, "gpushare", args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            err.contains("schema") && err.contains(words),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?} rendered something");
    }
}

#[test]
fn the_whole_gpu_class_serves_nvidia_com_gpu_unless_told_otherwise_and_mig_never_does() {
    let Some(helm) = helm() else { return };
    let class = |objs: &[Value], name: &str| -> Value {
        of_kind(objs, "DeviceClass")
            .into_iter()
            .find(|c| c["metadata"]["name"] == name)
            .cloned()
            .unwrap()
    };
    let objs = objects(&template(&helm, "gpushare", &[]));
    assert_eq!(
        class(&objs, "gpu.nvidia.com")["spec"]["extendedResourceName"],
        "nvidia.com/gpu"
    );
    assert!(class(&objs, "mig.nvidia.com")["spec"]["extendedResourceName"].is_null());
    let objs = objects(&template(
        &helm,
        "gpushare",
        &[
            "--set",
            "deviceClasses.extendedResourceName=example.com/shared-gpu",
        ],
    ));
    assert_eq!(
        class(&objs, "gpu.nvidia.com")["spec"]["extendedResourceName"],
        "example.com/shared-gpu"
    );
    let objs = objects(&template(
        &helm,
        "gpushare",
        &["--set", "deviceClasses.extendedResourceName="],
    ));
    assert!(class(&objs, "gpu.nvidia.com")["spec"]["extendedResourceName"].is_null());
    // Rendered for 1.33 (no cluster to ask): DRA's v1beta2, which has no extendedResourceName.
    let objs = objects(&template(&helm, "gpushare", &["--kube-version", "1.33.5"]));
    for c in of_kind(&objs, "DeviceClass") {
        assert_eq!(c["apiVersion"], "resource.k8s.io/v1beta2", "{c}");
        assert!(c["spec"]["extendedResourceName"].is_null(), "{c}");
    }
    let objs = objects(&template(&helm, "gpushare", &["--kube-version", "1.34.0"]));
    assert_eq!(
        class(&objs, "gpu.nvidia.com")["apiVersion"],
        "resource.k8s.io/v1"
    );
    // Classes of other names, for a second release beside NVIDIA's or another driver name's.
    let objs = objects(&template(
        &helm,
        "gpushare",
        &[
            "--set",
            "deviceClasses.names.gpu=gpu.gpushare.example.com",
            "--set",
            "deviceClasses.names.mig=mig.gpushare.example.com",
        ],
    ));
    let names: Vec<&str> = of_kind(&objs, "DeviceClass")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["gpu.gpushare.example.com", "mig.gpushare.example.com"]
    );
    assert_eq!(
        class(&objs, "gpu.gpushare.example.com")["spec"]["extendedResourceName"],
        "nvidia.com/gpu"
    );
}
