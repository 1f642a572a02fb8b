//! Partitionable devices end to end: a real gpushared on simulated nodes, the real
//! `gpushare-dra`, and the API-server stand-in playing servers that keep the counters
//! (Kubernetes 1.34: each GPU's counter set with its devices; 1.35: counter sets apart, at
//! most 64 counter-consuming devices a slice) or drop them (the feature off). What the
//! scheduler could allocate from the published counters is allocated by a first-fit stand-in
//! of the scheduler and prepared by gpushared: everything the counters admit is made, what
//! they refuse gpushared refuses too.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use gpushare_proto::{Method, MigApplyParams, MigApplyResult};
use gpushare_slice::{
    counters_of_object, devices_of_object, validate_pool, ApiVersion, Layout, Metadata, Pool,
    ResourceSlice, ResourceSliceSpec,
};
use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::*;

fn daemon(profile: &str) -> Daemon {
    Daemon::start_on(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        profile,
    )
}

/// Our slices as the stand-in stores them, in our model, ordered by name.
fn ours(api: &ApiServer) -> Vec<ResourceSlice> {
    let mut v: Vec<ResourceSlice> = api
        .slices()
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .map(|o| read(&o))
        .collect();
    v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    v
}

fn read(o: &Value) -> ResourceSlice {
    ResourceSlice {
        api_version: o["apiVersion"].as_str().unwrap().into(),
        kind: "ResourceSlice".into(),
        metadata: Metadata {
            name: o["metadata"]["name"].as_str().unwrap().into(),
        },
        spec: ResourceSliceSpec {
            driver: o["spec"]["driver"].as_str().unwrap().into(),
            pool: serde_json::from_value::<Pool>(o["spec"]["pool"].clone()).unwrap(),
            node_name: NODE.into(),
            devices: devices_of_object(o, ApiVersion::V1).unwrap(),
            shared_counters: counters_of_object(o).unwrap(),
        },
    }
}

fn names(pool: &[ResourceSlice]) -> Vec<String> {
    pool.iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| d.name.clone())
        .collect()
}

fn amount(q: &str) -> u128 {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u128 = digits.parse().unwrap();
    match &q[digits.len()..] {
        "" => n,
        "Mi" => n << 20,
        "Gi" => n << 30,
        other => panic!("suffix {other:?}"),
    }
}

/// The scheduler's view of a pool's counters: what each set has left.
struct Scheduler {
    left: BTreeMap<String, BTreeMap<String, u128>>,
}

impl Scheduler {
    fn new(pool: &[ResourceSlice]) -> Scheduler {
        let left = pool
            .iter()
            .flat_map(|s| &s.spec.shared_counters)
            .map(|set| {
                (
                    set.name.clone(),
                    set.counters
                        .iter()
                        .map(|(k, v)| (k.clone(), amount(&v.value)))
                        .collect(),
                )
            })
            .collect();
        Scheduler { left }
    }

    fn fits(&self, d: &gpushare_slice::Device) -> bool {
        d.consumes_counters.iter().all(|c| {
            c.counters.iter().all(|(k, v)| {
                self.left[&c.counter_set]
                    .get(k)
                    .is_some_and(|h| *h >= amount(&v.value))
            })
        })
    }

    /// First fit, in the pool's order, of a device `want` accepts and the counters admit.
    fn allocate(
        &mut self,
        pool: &[ResourceSlice],
        want: impl Fn(&gpushare_slice::Device) -> bool,
    ) -> Option<String> {
        let d = pool
            .iter()
            .flat_map(|s| &s.spec.devices)
            .find(|d| want(d) && self.fits(d))?
            .clone();
        for c in &d.consumes_counters {
            for (k, v) in &c.counters {
                *self
                    .left
                    .get_mut(&c.counter_set)
                    .unwrap()
                    .get_mut(k)
                    .unwrap() -= amount(&v.value);
            }
        }
        Some(d.name)
    }
}

fn claim(uid: &str, device: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}]}}}})
}

fn profile_is<'a>(p: &'a str) -> impl Fn(&gpushare_slice::Device) -> bool + 'a {
    move |d| {
        d.name.starts_with("gpu-0-")
            && d.attributes
                .get("profile")
                .and_then(|a| a.string.as_deref())
                == Some(p)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_35_server_gets_every_slice_and_the_scheduler_can_take_only_what_gpushared_makes() {
    if !need(is_root(), "root") {
        return;
    }
    // p5.48xlarge: eight H100 with MIG mode off, which turn it on and off without a reset.
    let d = daemon("p5.48xlarge");
    let api = ApiServer::start(NODE).await;
    api.set_kubernetes_minor(35);
    api.set_partitionable(true);
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(
        wait_until(Duration::from_secs(15), || ours(&api).len() == 9),
        "{:?}\n{}",
        names(&ours(&api)),
        plugin.log()
    );
    let pool = ours(&api);
    validate_pool(&pool, Layout::Split).unwrap();
    assert!(api.invalid().is_empty(), "{:?}", api.invalid());
    assert!(api.dry_runs() >= 1, "the plugin asked before publishing");
    let counters: Vec<&ResourceSlice> = pool
        .iter()
        .filter(|s| !s.spec.shared_counters.is_empty())
        .collect();
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].spec.shared_counters.len(), 8);
    for s in pool.iter().filter(|s| !s.spec.devices.is_empty()) {
        // The whole GPU and its 25 (profile, placement)s, all drawing from its set.
        assert_eq!(s.spec.devices.len(), 26, "{}", s.metadata.name);
        assert!(s.spec.devices.len() <= 64);
        assert!(s
            .spec
            .devices
            .iter()
            .all(|d| !d.consumes_counters.is_empty()));
    }
    let all = names(&pool);
    assert!(all.contains(&"gpu-0".to_string()));
    assert!(all.contains(&"gpu-7-mig-7g80gb-0-0".to_string()));
    assert_eq!(
        plugin.log().matches("keeps partitionable devices").count(),
        1,
        "{}",
        plugin.log()
    );

    // The scheduler cuts gpu-0: 3g.40gb, 2g.20gb, 1g.10gb fit; another 1g.10gb does not.
    let mut sched = Scheduler::new(&pool);
    let mut held = Vec::new();
    for (i, p) in ["3g.40gb", "2g.20gb", "1g.10gb"].into_iter().enumerate() {
        let dev = sched
            .allocate(&pool, profile_is(p))
            .unwrap_or_else(|| panic!("no {p} left"));
        let uid = unique_uid(&format!("cut{i}"));
        let r = d.prepare(&claim(&uid, &dev));
        assert!(r.is_ok(), "{dev}: {r:?}\n{}", d.log());
        held.push((uid, dev));
    }
    let made: Vec<&str> = held.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(
        made,
        [
            "gpu-0-mig-3g40gb-9-0",
            "gpu-0-mig-2g20gb-14-4",
            "gpu-0-mig-1g10gb-19-6"
        ]
    );
    assert!(sched.allocate(&pool, profile_is("1g.10gb")).is_none());
    assert!(sched.allocate(&pool, |d| d.name == "gpu-0").is_none());
    // What the counters refuse, gpushared refuses: every other slice of gpu-0 overlaps.
    for dev in all
        .iter()
        .filter(|n| n.starts_with("gpu-0-mig-") && !made.contains(&n.as_str()))
        .chain([&"gpu-0".to_string()])
    {
        let r = d.prepare(&claim(&unique_uid("over"), dev));
        assert!(r.is_err(), "{dev} was prepared beside {made:?}");
    }
    // The pool stays as it was published while claims come and go.
    let before: Vec<_> = pool.iter().map(|s| s.spec.clone()).collect();
    for (uid, _) in &held {
        d.unprepare(uid);
    }
    // Released, the whole GPU can be had (MIG mode turned off without a reset).
    let whole = unique_uid("whole");
    d.prepare(&claim(&whole, "gpu-0")).unwrap();
    d.unprepare(&whole);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: Vec<_> = ours(&api).into_iter().map(|s| s.spec).collect();
    assert_eq!(before, after, "claims changed the published pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_server_gets_each_gpus_counters_with_its_devices_and_static_instances_as_they_are() {
    if !need(is_root(), "root") {
        return;
    }
    // gpu-2 in MIG mode (Ampere: it cannot leave it), the others off (Ampere: cannot enter).
    let d = daemon(&p4d_mig_profile());
    let api = ApiServer::start(NODE).await;
    api.set_partitionable(true);
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(
        wait_until(Duration::from_secs(15), || ours(&api).len() == 2),
        "{:?}\n{}",
        names(&ours(&api)),
        plugin.log()
    );
    let pool = ours(&api);
    validate_pool(&pool, Layout::Combined).unwrap();
    let combined: Vec<&ResourceSlice> = pool
        .iter()
        .filter(|s| !s.spec.shared_counters.is_empty())
        .collect();
    assert_eq!(combined.len(), 1);
    assert_eq!(
        combined[0].spec.shared_counters[0].name,
        "gpu-2-counter-set"
    );
    assert_eq!(combined[0].spec.devices.len(), 25, "no whole gpu-2");
    let plain: Vec<String> = pool
        .iter()
        .filter(|s| s.spec.shared_counters.is_empty())
        .flat_map(|s| s.spec.devices.iter().map(|d| d.name.clone()))
        .collect();
    assert_eq!(
        plain,
        ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    );

    // A layout applied by `gpushare mig apply`: a static instance, published with its UUID;
    // what overlaps it is gone.
    let layout = "version: v1\nmig-configs:\n  one:\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 1}\n";
    let r: MigApplyResult = d
        .client()
        .call(
            Method::MigApply,
            Some(&MigApplyParams {
                layout: layout.into(),
                config: "one".into(),
                dry_run: false,
            }),
        )
        .unwrap();
    let created = r.gpus[0].create[0].clone();
    let (name, uuid) = created.split_once('=').unwrap();
    let static_seen = |api: &ApiServer| {
        let pool = ours(api);
        pool.iter().flat_map(|s| &s.spec.devices).any(|dev| {
            dev.name == name
                && dev.attributes.get("uuid").and_then(|a| a.string.as_deref()) == Some(uuid)
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), || static_seen(&api)),
        "{created}: {:?}\n{}",
        names(&ours(&api)),
        plugin.log()
    );
    let pool = ours(&api);
    validate_pool(&pool, Layout::Combined).unwrap();
    let mig: Vec<String> = names(&pool)
        .into_iter()
        .filter(|n| n.starts_with("gpu-2-mig-"))
        .collect();
    // The 3g.20gb at 0 holds memory slices 0..=3: what is left lies in 4..=7.
    assert_eq!(name, "gpu-2-mig-3g20gb-9-0");
    for n in &mig {
        let start: u32 = n.rsplit('-').next().unwrap().parse().unwrap();
        assert!(n == name || start >= 4, "{n} overlaps the static instance");
    }
    assert!(mig.contains(&"gpu-2-mig-3g20gb-9-4".to_string()));
    assert!(!mig.contains(&"gpu-2-mig-4g20gb-5-0".to_string()));
    assert!(api.invalid().is_empty(), "{:?}", api.invalid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_counters_gets_the_static_devices_and_one_line_saying_why() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon("p5.48xlarge");
    // The stand-in's default: Kubernetes 1.34 without DRAPartitionableDevices.
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(
        wait_until(Duration::from_secs(15), || !ours(&api).is_empty()),
        "{}",
        plugin.log()
    );
    let pool = ours(&api);
    validate_pool(&pool, Layout::Static).unwrap();
    assert_eq!(
        names(&pool),
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>(),
        "only what exists: no slice that is not made yet"
    );
    assert!(api.dry_runs() >= 1);
    // Once, also after a wipe has the pool published again.
    assert_eq!(api.wipe_node_slices(NODE), 1);
    assert!(wait_until(Duration::from_secs(5), || ours(&api).len() == 1));
    let log = plugin.log();
    assert_eq!(
        log.matches("drops spec.sharedCounters and consumesCounters")
            .count(),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_a_server_stops_keeping_turn_the_publisher_static() {
    if !need(is_root(), "root") {
        return;
    }
    let d = daemon("p5.48xlarge");
    let api = ApiServer::start(NODE).await;
    api.set_partitionable(true);
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &d.socket, &[]);
    assert!(
        wait_until(Duration::from_secs(15), || ours(&api).len() == 8),
        "{}",
        plugin.log()
    );
    // The API server restarts without the feature; kubelet's start wipes the slices.
    api.set_partitionable(false);
    api.wipe_node_slices(NODE);
    let is_static = |api: &ApiServer| {
        let pool = ours(api);
        !pool.is_empty() && names(&pool) == (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(20), || is_static(&api)),
        "{:?}\n{}",
        names(&ours(&api)),
        plugin.log()
    );
    assert!(
        plugin
            .log()
            .contains("dropped the counters of a ResourceSlice it stored"),
        "{}",
        plugin.log()
    );
    validate_pool(&ours(&api), Layout::Static).unwrap();
}

/// The stand-in refuses what each server version refuses, so the tests above prove
/// something: a slice of one version's layout sent to the other, too many counters or
/// devices, and without the feature the fields dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_refuses_what_each_version_refuses() {
    use gpushare_dra::api::{client, Api};
    use gpushare_proto::GpuInfo;
    let api = ApiServer::start(NODE).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.kubeconfig(NODE, &kubeconfig);
    let c = Api::new(client(Some(&kubeconfig)).await.unwrap());
    // Three H100s' worth of slices, as list_gpus reports a p5 node on which gpushared may
    // cut them, built from a fixture: no daemon needed here.
    let gpu = |minor: u32| -> GpuInfo {
        let cap = json!({"memory_mib": 9984, "multiprocessors": 16, "copy_engines": 1,
            "decoders": 1, "encoders": 0, "jpeg_engines": 1, "ofa_engines": 0});
        serde_json::from_value(json!({
            "name": format!("gpu-{minor}"), "minor": minor, "uuid": format!("GPU-{minor}"),
            "product_name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
            "compute_mode": "Default", "time_slice": "Default", "sharing": "Free", "claims": [],
            "mig_partitions": {"whole_gpu": true, "slices": true, "memory_slices": 8,
                "capacity": cap, "placements": (0..7).map(|i| json!({"profile": "1g.10gb",
                "gi_profile_id": 19, "placement_start": i, "memory_slices": 1, "capacity": cap}))
                .collect::<Vec<_>>()}
        }))
        .unwrap()
    };
    let gpus: Vec<GpuInfo> = (0..3).map(gpu).collect();
    let pool = |layout| gpushare_slice::build_pool_in(&gpus, NODE, "gpu.nvidia.com", 1, layout);
    let put = |s: &ResourceSlice| {
        let mut o = s.to_api_object(ApiVersion::V1);
        o["metadata"] = json!({"generateName": "t-"});
        o
    };
    let refused = |r: Result<Value, gpushare_dra::api::ApiError>| -> String {
        match r {
            Err(e) if e.code() == Some(422) => e.to_string(),
            other => panic!("not refused as invalid: {other:?}"),
        }
    };
    api.set_partitionable(true);
    // 1.34: a device slice of the split layout consumes counters of another slice.
    let split = pool(Layout::Split);
    let e = refused(c.create_slice(ApiVersion::V1, &put(&split[1])).await);
    assert!(e.contains("must reference a counter set defined"), "{e}");
    // 1.34: three GPUs' sets in one slice, 45 counters.
    let mut three = pool(Layout::Combined)[0].clone();
    for s in &pool(Layout::Combined)[1..] {
        three
            .spec
            .shared_counters
            .extend(s.spec.shared_counters.clone());
    }
    let e = refused(c.create_slice(ApiVersion::V1, &put(&three)).await);
    assert!(e.contains("45 counters"), "{e}");
    // The combined slice is what 1.34 takes, also as a dry run, which stores nothing.
    let one = put(&pool(Layout::Combined)[0]);
    let got = c.create_slice_dry_run(ApiVersion::V1, &one).await.unwrap();
    assert_eq!(got["spec"]["sharedCounters"], one["spec"]["sharedCounters"]);
    assert!(api.slices().is_empty());
    assert_eq!(api.dry_runs(), 1);
    // 1.35: devices and counters in one slice; more than 64 counter-consuming devices.
    api.set_kubernetes_minor(35);
    assert_eq!(c.server_minor().await.unwrap(), 35);
    let e = refused(c.create_slice(ApiVersion::V1, &one).await);
    assert!(e.contains("only one of devices and sharedCounters"), "{e}");
    let mut many = split[1].clone();
    let first = many.spec.devices[0].clone();
    while many.spec.devices.len() <= 64 {
        let name = format!("pad-{}", many.spec.devices.len());
        many.spec.devices.push(gpushare_slice::Device {
            name,
            ..first.clone()
        });
    }
    assert!(many.spec.devices.len() > 64);
    let e = refused(c.create_slice(ApiVersion::V1, &put(&many)).await);
    assert!(e.contains("at most 64 items"), "{e}");
    for s in &split {
        c.create_slice(ApiVersion::V1, &put(s)).await.unwrap();
    }
    assert!(api.invalid().len() == 4, "{:?}", api.invalid());
    // Without the feature: nothing refused, the counters gone.
    api.set_partitionable(false);
    let got = c.create_slice(ApiVersion::V1, &one).await.unwrap();
    assert!(got["spec"].get("sharedCounters").is_none(), "{got}");
    assert!(got["spec"]["devices"][0].get("consumesCounters").is_none());
}
