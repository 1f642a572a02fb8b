//! Keeps `docs/protocol.schema.json` and the examples in `docs/protocol.md` true to the wire
//! types of `gpushare-proto`.
//!
//! The test lives in this crate because the hook is the protocol client that ships to every
//! node; the proto crate stays free of test-only weight.
//!
//! A small validator below covers exactly the JSON Schema keywords the schema uses and panics on
//! any other, so the schema cannot grow a keyword these tests silently skip.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;

use gpushare_proto::{
    AttachParams, Attachment, ClaimDevice, ClaimInfo, ClaimPage, ClaimState, ComputeMode,
    DetachParams, DetachResult, ErrorBody, ErrorCode, GpuInfo, GpuSharing, GroupInfo, HealthInfo,
    ListClaimsParams, Method, MigApplyParams, MigApplyResult, MigCapacity, MigDeviceInfo,
    MigGpuPlan, MigInstanceInfo, MigOrigin, MigPartitions, MigSlot, MpsInfo, PodRef, PrepareParams,
    PrepareResult, PreparedDevice, Request, RequestDevices, Response, StrategyInfo,
    TimeSliceInterval, UidParams, UnprepareResult, VersionInfo, OLDEST_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

fn load_schema() -> Value {
    let path = docs_dir().join("protocol.schema.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("wire types serialize")
}

// ---------------------------------------------------------------------------------------------
// A validator for the subset of draft 2020-12 the schema uses.

/// Keywords that only annotate and never constrain.
const ANNOTATIONS: [&str; 8] = [
    "$schema",
    "$id",
    "$defs",
    "$comment",
    "title",
    "description",
    "examples",
    "default",
];

/// The `pattern`s the schema may use, each with its meaning in Rust (no regex engine here).
fn pattern_matches(pattern: &str, text: &str) -> bool {
    match pattern {
        // A decimal ordinal without leading zeros: how serde writes a `u32` map key.
        "^(0|[1-9][0-9]*)$" => {
            !text.is_empty()
                && text.bytes().all(|b| b.is_ascii_digit())
                && (text == "0" || !text.starts_with('0'))
        }
        other => panic!("schema uses pattern {other:?}, unknown to this test"),
    }
}

struct Validator<'a> {
    root: &'a Value,
}

impl<'a> Validator<'a> {
    fn def(&self, name: &str) -> &'a Value {
        self.root["$defs"]
            .get(name)
            .unwrap_or_else(|| panic!("no $defs entry {name:?}"))
    }

    fn follow(&self, reference: &Value) -> &'a Value {
        let reference = reference.as_str().expect("$ref is a string");
        let name = reference
            .strip_prefix("#/$defs/")
            .unwrap_or_else(|| panic!("only local $defs refs are used, got {reference}"));
        self.def(name)
    }

    fn is_valid(&self, schema: &Value, instance: &Value) -> bool {
        let mut errors = Vec::new();
        self.check(schema, instance, "$", &mut errors);
        errors.is_empty()
    }

    fn errors(&self, schema: &Value, instance: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, instance, "$", &mut errors);
        errors
    }

    fn check(&self, schema: &Value, instance: &Value, at: &str, errors: &mut Vec<String>) {
        let schema = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => {
                errors.push(format!("{at}: no value is allowed here"));
                return;
            }
            Value::Object(schema) => schema,
            other => panic!("{at}: a schema must be an object or a boolean, got {other}"),
        };
        for (keyword, arg) in schema {
            match keyword.as_str() {
                k if ANNOTATIONS.contains(&k) => {}
                "$ref" => self.check(self.follow(arg), instance, at, errors),
                "type" => {
                    let allowed: Vec<&str> = match arg {
                        Value::String(one) => vec![one.as_str()],
                        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
                        other => panic!("{at}: bad type {other}"),
                    };
                    if !allowed.iter().any(|t| has_type(instance, t)) {
                        errors.push(format!("{at}: {instance} is not of type {allowed:?}"));
                    }
                }
                "const" => {
                    if instance != arg {
                        errors.push(format!("{at}: {instance} is not {arg}"));
                    }
                }
                "enum" => {
                    let options = arg.as_array().expect("enum is an array");
                    if !options.contains(instance) {
                        errors.push(format!("{at}: {instance} is not one of {arg}"));
                    }
                }
                "properties" => {
                    if let Some(object) = instance.as_object() {
                        for (name, sub) in arg.as_object().expect("properties is an object") {
                            if let Some(value) = object.get(name) {
                                self.check(sub, value, &format!("{at}.{name}"), errors);
                            }
                        }
                    }
                }
                "required" => {
                    if let Some(object) = instance.as_object() {
                        for name in arg.as_array().expect("required is an array") {
                            let name = name.as_str().expect("required names are strings");
                            if !object.contains_key(name) {
                                errors.push(format!("{at}: missing required field {name:?}"));
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Some(object) = instance.as_object() {
                        let declared = schema.get("properties").and_then(Value::as_object);
                        for (name, value) in object {
                            if declared.is_some_and(|d| d.contains_key(name)) {
                                continue;
                            }
                            self.check(arg, value, &format!("{at}.{name}"), errors);
                        }
                    }
                }
                "propertyNames" => {
                    if let Some(object) = instance.as_object() {
                        for name in object.keys() {
                            let key = Value::String(name.clone());
                            self.check(arg, &key, &format!("{at}[key {name:?}]"), errors);
                        }
                    }
                }
                "pattern" => {
                    if let Some(text) = instance.as_str() {
                        let pattern = arg.as_str().expect("pattern is a string");
                        if !pattern_matches(pattern, text) {
                            errors.push(format!("{at}: {text:?} does not match {pattern}"));
                        }
                    }
                }
                "items" => {
                    if let Some(items) = instance.as_array() {
                        for (i, item) in items.iter().enumerate() {
                            self.check(arg, item, &format!("{at}[{i}]"), errors);
                        }
                    }
                }
                "minimum" | "maximum" => {
                    if instance.is_number() {
                        let below = compare(instance, arg) == std::cmp::Ordering::Less;
                        let above = compare(instance, arg) == std::cmp::Ordering::Greater;
                        if (keyword == "minimum" && below) || (keyword == "maximum" && above) {
                            errors.push(format!(
                                "{at}: {instance} is out of range ({keyword} {arg})"
                            ));
                        }
                    }
                }
                "allOf" => {
                    for sub in arg.as_array().expect("allOf is an array") {
                        self.check(sub, instance, at, errors);
                    }
                }
                "anyOf" => {
                    let branches = arg.as_array().expect("anyOf is an array");
                    if !branches.iter().any(|b| self.is_valid(b, instance)) {
                        errors.push(format!("{at}: {instance} matches no anyOf branch"));
                    }
                }
                "oneOf" => {
                    let branches = arg.as_array().expect("oneOf is an array");
                    let matching = branches
                        .iter()
                        .filter(|b| self.is_valid(b, instance))
                        .count();
                    if matching != 1 {
                        errors.push(format!(
                            "{at}: {instance} matches {matching} oneOf branches, not exactly one"
                        ));
                    }
                }
                other => panic!("{at}: schema keyword {other:?} is unknown to this test"),
            }
        }
    }

    /// The subschemas that apply to each property of `instance`, through `$ref`, `allOf` and
    /// the `oneOf`/`anyOf` branches it matches.
    fn property_schemas(
        &self,
        schema: &'a Value,
        instance: &Value,
        out: &mut BTreeMap<String, Vec<&'a Value>>,
    ) {
        if let Some(reference) = schema.get("$ref") {
            self.property_schemas(self.follow(reference), instance, out);
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in properties {
                out.entry(name.clone()).or_default().push(sub);
            }
        }
        for sub in branches(schema, "allOf") {
            self.property_schemas(sub, instance, out);
        }
        for sub in branches(schema, "oneOf").chain(branches(schema, "anyOf")) {
            if self.is_valid(sub, instance) {
                self.property_schemas(sub, instance, out);
            }
        }
    }

    /// The `items` subschemas that apply to an array `instance`.
    fn item_schemas(&self, schema: &'a Value, instance: &Value, out: &mut Vec<&'a Value>) {
        if let Some(reference) = schema.get("$ref") {
            self.item_schemas(self.follow(reference), instance, out);
        }
        if let Some(items) = schema.get("items") {
            out.push(items);
        }
        for sub in branches(schema, "allOf") {
            self.item_schemas(sub, instance, out);
        }
        for sub in branches(schema, "oneOf").chain(branches(schema, "anyOf")) {
            if self.is_valid(sub, instance) {
                self.item_schemas(sub, instance, out);
            }
        }
    }

    /// Checks that every object inside `instance` has exactly the fields its schema declares:
    /// validation alone lets an undeclared field through wherever results are left open.
    fn exact_fields(
        &self,
        schema: &'a Value,
        instance: &Value,
        at: &str,
        errors: &mut Vec<String>,
    ) {
        match instance {
            Value::Object(object) => {
                let mut declared = BTreeMap::new();
                self.property_schemas(schema, instance, &mut declared);
                if declared.is_empty() {
                    return;
                }
                let have: BTreeSet<&String> = object.keys().collect();
                let want: BTreeSet<&String> = declared.keys().collect();
                if have != want {
                    errors.push(format!(
                        "{at}: the type writes fields {have:?} but the schema declares {want:?}"
                    ));
                }
                for (name, value) in object {
                    for sub in declared.get(name).into_iter().flatten() {
                        self.exact_fields(sub, value, &format!("{at}.{name}"), errors);
                    }
                }
            }
            Value::Array(items) => {
                let mut schemas = Vec::new();
                self.item_schemas(schema, instance, &mut schemas);
                for (i, item) in items.iter().enumerate() {
                    for sub in &schemas {
                        self.exact_fields(sub, item, &format!("{at}[{i}]"), errors);
                    }
                }
            }
            _ => {}
        }
    }
}

fn branches<'a>(schema: &'a Value, keyword: &str) -> impl Iterator<Item = &'a Value> {
    schema
        .get(keyword)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn has_type(instance: &Value, name: &str) -> bool {
    match name {
        "object" => instance.is_object(),
        "array" => instance.is_array(),
        "string" => instance.is_string(),
        "boolean" => instance.is_boolean(),
        "null" => instance.is_null(),
        "number" => instance.is_number(),
        "integer" => {
            instance.is_i64()
                || instance.is_u64()
                || instance.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        other => panic!("unknown JSON type {other:?}"),
    }
}

/// Compares two JSON numbers exactly when both are integers (u64 bounds do not fit an f64).
fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    let int = |v: &Value| {
        v.as_i64()
            .map(i128::from)
            .or_else(|| v.as_u64().map(i128::from))
    };
    match (int(a), int(b)) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            a.partial_cmp(&b).expect("comparable numbers")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Samples of every wire type, built from the Rust types themselves.

const UID: &str = "7f3e2d1c-0b9a-4876-9543-21fedcba9876";

fn request_devices() -> RequestDevices {
    RequestDevices {
        request: "gpus".into(),
        cdi_device_ids: vec![format!("gpushare.io/claim={UID}")],
        devices: vec!["gpu-4".into(), "gpu-5".into()],
        per_device: vec![
            PreparedDevice {
                device: "gpu-4".into(),
                pool: "node-a".into(),
                cdi_device_ids: vec![],
            },
            PreparedDevice {
                device: "gpu-5".into(),
                pool: "node-a".into(),
                cdi_device_ids: vec![format!("gpushare.io/claim={UID}")],
            },
        ],
    }
}

fn claim_device(minor: u32) -> ClaimDevice {
    ClaimDevice {
        request: "gpus".into(),
        device: format!("gpu-{minor}"),
        uuid: format!("GPU-{minor:08}-0000-4000-8000-000000000000"),
        minor,
    }
}

fn mps_info() -> MpsInfo {
    MpsInfo {
        control_daemon_pid: 4127,
        pipe_dir: format!("/run/gpushare/claims/{UID}/pipe"),
        log_dir: format!("/run/gpushare/claims/{UID}/log"),
        shm_dir: format!("/run/gpushare/claims/{UID}/shm"),
        visible_devices: vec!["GPU-a".into(), "GPU-b".into()],
        active_thread_percentage: "30.0".into(),
        pinned_device_memory_limits: BTreeMap::from([
            ("0".into(), "8G".into()),
            ("1".into(), "20G".into()),
            ("10".into(), String::new()),
        ]),
        control_daemon_start_time: 918_273,
        requested: gpushare_proto::MpsRequested {
            multi_user: false,
            active_thread_percentage: Some(30),
            pinned_limits_mib: vec![Some(8192), None],
            shm_bytes: 1 << 30,
        },
        restarts: 2,
    }
}

fn strategies() -> Vec<StrategyInfo> {
    vec![
        StrategyInfo::Exclusive,
        StrategyInfo::TimeSlicing {
            interval: TimeSliceInterval::Short,
        },
        StrategyInfo::Mps(mps_info()),
    ]
}

fn attachment(full: bool) -> Attachment {
    Attachment {
        claim_uid: UID.into(),
        container_id: "8f1d6b2a".into(),
        pid: full.then_some(48213),
        cgroup: full.then(|| "/kubepods.slice/cri-containerd-8f1d6b2a.scope".into()),
        bundle: full.then(|| "/run/containerd/bundle/8f1d6b2a".into()),
        attached_at: 1_767_225_600,
        pod: full.then(|| PodRef {
            namespace: "team-a".into(),
            name: "trainer-0".into(),
        }),
    }
}

fn claim_info(limited: bool) -> ClaimInfo {
    ClaimInfo {
        uid: UID.into(),
        namespace: "team-a".into(),
        name: "train-mps-2gpu".into(),
        state: ClaimState::Prepared,
        groups: strategies()
            .into_iter()
            .map(|sharing| GroupInfo {
                requests: vec!["gpus".into()],
                devices: vec![claim_device(4), claim_device(5)],
                sharing,
                mig: Vec::new(),
            })
            .collect(),
        requests: vec![request_devices()],
        cdi_spec: format!("/var/run/cdi/gpushare.io-claim_{UID}.json"),
        attach_limit: limited.then_some(4),
        attached: vec![attachment(true), attachment(false)],
        last_error: limited.then(|| "MPS control daemon (pid 4100) exited".into()),
        restarts: 2,
        resource_version: limited.then(|| "48213".into()),
        generation: 7,
    }
}

fn gpu_info() -> GpuInfo {
    GpuInfo {
        name: "gpu-4".into(),
        minor: 4,
        uuid: "GPU-a".into(),
        product_name: "NVIDIA A100-SXM4-40GB".into(),
        memory_mib: 40960,
        compute_mode: ComputeMode::ExclusiveProcess,
        time_slice: TimeSliceInterval::Default,
        sharing: GpuSharing::Mps,
        claims: vec![UID.into()],
        brand: "Nvidia".into(),
        architecture: "Ampere".into(),
        cuda_compute_capability: "8.0".into(),
        driver_version: "570.172.08".into(),
        cuda_driver_version: "12.8".into(),
        pci_bus_id: "00000000:10:1C.0".into(),
        numa_node: Some(0),
        mig_capable: true,
        mig_enabled: true,
        mig_pending: Some(false),
        mig_devices: vec![mig_device()],
        mig_partitions: Some(mig_partitions()),
    }
}

fn mig_capacity() -> MigCapacity {
    MigCapacity {
        memory_mib: 19968,
        multiprocessors: 42,
        copy_engines: 3,
        decoders: 2,
        encoders: 0,
        jpeg_engines: 0,
        ofa_engines: 0,
    }
}

fn mig_slot() -> MigSlot {
    MigSlot {
        profile: "3g.20gb".into(),
        gi_profile_id: 9,
        placement_start: 0,
        memory_slices: 4,
        capacity: mig_capacity(),
    }
}

fn mig_partitions() -> MigPartitions {
    MigPartitions {
        whole_gpu: false,
        slices: true,
        memory_slices: 8,
        capacity: MigCapacity {
            memory_mib: 40192,
            multiprocessors: 98,
            copy_engines: 7,
            decoders: 5,
            encoders: 0,
            jpeg_engines: 1,
            ofa_engines: 1,
        },
        placements: vec![mig_slot()],
    }
}

fn mig_instance(complete: bool) -> MigInstanceInfo {
    MigInstanceInfo {
        request: "gpu".into(),
        device: "gpu-2-mig-3g20gb-9-4".into(),
        gpu_uuid: "GPU-a".into(),
        gpu_minor: 2,
        profile: "3g.20gb".into(),
        gi_profile_id: 9,
        placement_start: 4,
        memory_slices: 4,
        gi_id: 2,
        ci_id: complete.then_some(0),
        uuid: if complete {
            "MIG-a".into()
        } else {
            String::new()
        },
        // A slice made again after a reset keeps its first name; one first made has none.
        original_uuid: if complete {
            "MIG-first".into()
        } else {
            String::new()
        },
        // Both origins, and the flag both ways, are shapes the schema must take.
        origin: if complete {
            MigOrigin::Existing
        } else {
            MigOrigin::Created
        },
        enabled_mig_mode: !complete,
        destroying: !complete,
    }
}

fn mig_apply_params() -> MigApplyParams {
    MigApplyParams {
        layout: "version: v1\nmig-configs: {}\n".into(),
        config: "all".into(),
        dry_run: true,
    }
}

fn mig_apply_result() -> MigApplyResult {
    MigApplyResult {
        config: "halves".into(),
        dry_run: false,
        gpus: vec![
            MigGpuPlan {
                gpu: "gpu-2".into(),
                set_mig_mode: Some(true),
                destroy: vec!["gpu-2-mig-7g40gb-0-0".into()],
                create: vec!["gpu-2-mig-3g20gb-9-0=MIG-a".into()],
                note: Some("reset".into()),
                held_by: vec![],
            },
            MigGpuPlan {
                gpu: "gpu-3".into(),
                set_mig_mode: None,
                destroy: vec![],
                create: vec![],
                note: None,
                held_by: vec![UID.into()],
            },
        ],
    }
}

fn mig_device() -> MigDeviceInfo {
    MigDeviceInfo {
        uuid: "MIG-a".into(),
        profile: "3g.20gb".into(),
        gi_profile_id: 9,
        placement_start: 4,
        memory_slices: 4,
        memory_mib: 19968,
        multiprocessors: 42,
        copy_engines: 3,
        decoders: 2,
        encoders: 0,
        jpeg_engines: 0,
        ofa_engines: 0,
        gi_id: Some(2),
        owner: Some(UID.into()),
    }
}

fn claim_object() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "c", "namespace": "n", "uid": UID}})
}

/// Every variant of every enum, listed by hand. The matches in `_exhaustive_*` fail to compile
/// when a variant is added, which is the reminder to list it here and in the schema.
const ERROR_CODES: [ErrorCode; 13] = [
    ErrorCode::InvalidConfig,
    ErrorCode::InvalidRequest,
    ErrorCode::WrongNode,
    ErrorCode::UnknownDevice,
    ErrorCode::Conflict,
    ErrorCode::Unsupported,
    ErrorCode::NotReady,
    ErrorCode::NotFound,
    ErrorCode::LimitReached,
    ErrorCode::PermissionDenied,
    ErrorCode::Stale,
    ErrorCode::Busy,
    ErrorCode::Internal,
];
const CLAIM_STATES: [ClaimState; 4] = [
    ClaimState::PrepareStarted,
    ClaimState::Prepared,
    ClaimState::Unpreparing,
    ClaimState::Degraded,
];
const INTERVALS: [TimeSliceInterval; 4] = [
    TimeSliceInterval::Default,
    TimeSliceInterval::Short,
    TimeSliceInterval::Medium,
    TimeSliceInterval::Long,
];
const COMPUTE_MODES: [ComputeMode; 3] = [
    ComputeMode::Default,
    ComputeMode::Prohibited,
    ComputeMode::ExclusiveProcess,
];
const GPU_SHARINGS: [GpuSharing; 5] = [
    GpuSharing::Free,
    GpuSharing::Exclusive,
    GpuSharing::TimeSlicing,
    GpuSharing::Mps,
    GpuSharing::Mig,
];

fn _exhaustive_error_code(code: ErrorCode) {
    match code {
        ErrorCode::InvalidConfig
        | ErrorCode::InvalidRequest
        | ErrorCode::WrongNode
        | ErrorCode::UnknownDevice
        | ErrorCode::Conflict
        | ErrorCode::Unsupported
        | ErrorCode::NotReady
        | ErrorCode::NotFound
        | ErrorCode::LimitReached
        | ErrorCode::PermissionDenied
        | ErrorCode::Stale
        | ErrorCode::Busy
        | ErrorCode::Internal => {}
    }
}

fn _exhaustive_others(
    state: ClaimState,
    interval: TimeSliceInterval,
    mode: ComputeMode,
    sharing: GpuSharing,
) {
    match state {
        ClaimState::PrepareStarted
        | ClaimState::Prepared
        | ClaimState::Unpreparing
        | ClaimState::Degraded => {}
    }
    match interval {
        TimeSliceInterval::Default
        | TimeSliceInterval::Short
        | TimeSliceInterval::Medium
        | TimeSliceInterval::Long => {}
    }
    match mode {
        ComputeMode::Default | ComputeMode::Prohibited | ComputeMode::ExclusiveProcess => {}
    }
    match sharing {
        GpuSharing::Free
        | GpuSharing::Exclusive
        | GpuSharing::TimeSlicing
        | GpuSharing::Mps
        | GpuSharing::Mig => {}
    }
}

/// Every protocol version.
const VERSIONS: std::ops::RangeInclusive<u32> = OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION;

/// The params and result `$defs` of each method in protocol `version`. Exhaustive on purpose: a
/// new method does not compile until it is placed here (and so in the schema).
fn method_defs(method: Method, version: u32) -> (Option<&'static str>, &'static str) {
    match method {
        Method::Prepare => (Some("PrepareParams"), "PrepareResult"),
        Method::Unprepare => (Some("UidParams"), "UnprepareResult"),
        Method::GetClaim => (Some("UidParams"), "ClaimInfo"),
        Method::ListClaims if version >= 2 => (Some("ListClaimsParams"), "ClaimPage"),
        Method::ListClaims => (None, "ListClaimsResult"),
        Method::ListGpus => (None, "ListGpusResult"),
        Method::Attach => (Some("AttachParams"), "Attachment"),
        Method::Detach => (Some("DetachParams"), "DetachResult"),
        Method::Health => (None, "HealthInfo"),
        Method::Version => (None, "VersionInfo"),
        Method::MigApply => (Some("MigApplyParams"), "MigApplyResult"),
    }
}

/// Params as the Rust client would send them for each method in protocol `version`.
fn params_for(method: Method, version: u32) -> Option<Value> {
    match method {
        Method::ListClaims if version >= 2 => Some(to_json(&ListClaimsParams {
            limit: Some(100),
            continue_from: Some(UID.into()),
        })),
        Method::Prepare => Some(to_json(&PrepareParams {
            claim: claim_object(),
        })),
        Method::Unprepare | Method::GetClaim => Some(to_json(&UidParams { uid: UID.into() })),
        Method::Attach => Some(to_json(&AttachParams {
            claim_uid: UID.into(),
            container_id: "8f1d6b2a".into(),
            pid: Some(48213),
            bundle: Some("/run/b".into()),
            pod: Some(PodRef {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
            }),
        })),
        Method::Detach => Some(to_json(&DetachParams {
            claim_uid: UID.into(),
            container_id: "8f1d6b2a".into(),
        })),
        Method::MigApply => Some(to_json(&mig_apply_params())),
        Method::ListClaims | Method::ListGpus | Method::Health | Method::Version => None,
    }
}

/// One or more serialized samples per `$defs` entry that stands for a Rust type.
fn samples() -> Vec<(&'static str, Value)> {
    let mut out = vec![
        (
            "PrepareParams",
            to_json(&PrepareParams {
                claim: claim_object(),
            }),
        ),
        ("UidParams", to_json(&UidParams { uid: UID.into() })),
        ("AttachParams", params_for(Method::Attach, 1).expect("params")),
        (
            "AttachParams",
            // (`pod: None` is left out, not null, for daemons before it: proto's tests.)
            to_json(&AttachParams {
                claim_uid: UID.into(),
                container_id: "c".into(),
                pid: None,
                bundle: None,
                pod: Some(PodRef {
                    namespace: "default".into(),
                    name: "p".into(),
                }),
            }),
        ),
        ("DetachParams", params_for(Method::Detach, 1).expect("params")),
        ("RequestDevices", to_json(&request_devices())),
        ("PreparedDevice", to_json(&request_devices().per_device[1])),
        (
            "PrepareResult",
            to_json(&PrepareResult {
                uid: UID.into(),
                requests: vec![request_devices()],
                already_prepared: true,
            }),
        ),
        (
            "UnprepareResult",
            to_json(&UnprepareResult {
                uid: UID.into(),
                released: false,
            }),
        ),
        ("ClaimDevice", to_json(&claim_device(7))),
        ("MpsInfo", to_json(&mps_info())),
        ("Attachment", to_json(&attachment(true))),
        ("Attachment", to_json(&attachment(false))),
        ("ClaimInfo", to_json(&claim_info(true))),
        ("ClaimInfo", to_json(&claim_info(false))),
        (
            "ListClaimsResult",
            to_json(&vec![claim_info(true), claim_info(false)]),
        ),
        ("ListClaimsResult", json!([])),
        ("ListClaimsParams", params_for(Method::ListClaims, 2).expect("params")),
        (
            "ClaimPage",
            to_json(&ClaimPage {
                claims: vec![claim_info(true), claim_info(false)],
                next: Some(UID.into()),
            }),
        ),
        (
            "ClaimPage",
            to_json(&ClaimPage {
                claims: vec![],
                next: None,
            }),
        ),
        ("GpuInfo", to_json(&gpu_info())),
        ("MigDeviceInfo", to_json(&mig_device())),
        ("MigPartitions", to_json(&mig_partitions())),
        ("MigCapacity", to_json(&mig_capacity())),
        ("MigSlot", to_json(&mig_slot())),
        (
            "PodRef",
            to_json(&PodRef {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
            }),
        ),
        (
            "GpuInfo",
            to_json(&GpuInfo {
                mig_partitions: None,
                ..gpu_info()
            }),
        ),
        ("MigInstanceInfo", to_json(&mig_instance(true))),
        ("MigInstanceInfo", to_json(&mig_instance(false))),
        ("MigApplyParams", to_json(&mig_apply_params())),
        ("MigApplyResult", to_json(&mig_apply_result())),
        ("MigGpuPlan", to_json(&mig_apply_result().gpus[1])),
        ("ListGpusResult", to_json(&vec![gpu_info()])),
        ("DetachResult", to_json(&DetachResult { detached: true })),
        (
            "HealthInfo",
            to_json(&HealthInfo {
                ready: true,
                node_name: "ip-10-0-1-23.us-west-2.compute.internal".into(),
                gpus: 8,
                claims: 2,
                backend: "simulated:p4d.24xlarge".into(),
                mps_control: "/usr/bin/nvidia-cuda-mps-control".into(),
                checkpoint_quarantined: Some(
                    "moved to /var/lib/gpushare/checkpoint.json.corrupt-1767225600: EOF".into(),
                ),
                checkpoint_error: None,
                quarantined_records: vec![
                    "claim \"x\" (from /var/lib/gpushare/checkpoint.json): request name \"-\" is not a valid one; kept at /var/lib/gpushare/quarantine/checkpoint-claim-1796131673-42-0.json".into(),
                ],
                degraded_claims: 1,
                stopping: false,
                drivers: vec!["gpu.nvidia.com".into()],
                driver_spec: Some(gpushare_proto::DriverSpecHealth {
                    path: "/var/run/cdi/gpushare.io-gpu.json".into(),
                    generator: "/usr/bin/nvidia-ctk cdi generate (driver root /)".into(),
                    ok: false,
                    error: Some("/usr/bin/nvidia-ctk cdi generate failed: exit 1; output: \"Failed to initialize NVML: Driver/library version mismatch\"".into()),
                    failures: 2,
                    retry_in_seconds: Some(17),
                    generate_timeout_seconds: Some(15),
                }),
            }),
        ),
        (
            "DriverSpecHealth",
            to_json(&gpushare_proto::DriverSpecHealth {
                path: "/var/run/cdi/gpushare.io-gpu.json".into(),
                generator: "the simulated nvidia-ctk cdi generate (driver root /run/gpushare/simulated-driver)".into(),
                ok: true,
                error: None,
                failures: 0,
                retry_in_seconds: None,
                generate_timeout_seconds: None,
            }),
        ),
        (
            "VersionInfo",
            to_json(&VersionInfo {
                daemon: "0.1.0".into(),
                protocol: PROTOCOL_VERSION,
            }),
        ),
        (
            "ErrorBody",
            to_json(&ErrorBody {
                code: ErrorCode::NotFound,
                message: "no claim".into(),
            }),
        ),
    ];
    for strategy in strategies() {
        out.push(("StrategyInfo", to_json(&strategy)));
        out.push((
            "GroupInfo",
            to_json(&GroupInfo {
                requests: vec!["gpus".into()],
                devices: vec![claim_device(1)],
                sharing: strategy,
                mig: vec![mig_instance(true), mig_instance(false)],
            }),
        ));
    }
    out.push((
        "MpsRequested",
        to_json(&gpushare_proto::MpsRequested::default()),
    ));
    out.extend(ERROR_CODES.iter().map(|c| ("ErrorCode", to_json(c))));
    out.extend(CLAIM_STATES.iter().map(|s| ("ClaimState", to_json(s))));
    out.extend(INTERVALS.iter().map(|i| ("TimeSliceInterval", to_json(i))));
    out.extend(COMPUTE_MODES.iter().map(|m| ("ComputeMode", to_json(m))));
    out.extend(GPU_SHARINGS.iter().map(|g| ("GpuSharing", to_json(g))));
    out
}

fn enum_values(schema: &Value, def: &str) -> Vec<Value> {
    schema["$defs"][def]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("$defs.{def} has an enum"))
        .clone()
}

// ---------------------------------------------------------------------------------------------
// Tests of the schema.

#[test]
fn schema_is_a_draft_2020_12_document_with_defs() {
    let schema = load_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(schema["$defs"].is_object());
}

#[test]
fn schema_has_a_def_for_every_wire_type() {
    let schema = load_schema();
    let defs = schema["$defs"].as_object().expect("$defs");
    let wanted = [
        "Request",
        "Response",
        "Method",
        "ErrorBody",
        "ErrorCode",
        "PrepareParams",
        "UidParams",
        "AttachParams",
        "DetachParams",
        "PrepareResult",
        "RequestDevices",
        "PreparedDevice",
        "UnprepareResult",
        "ClaimInfo",
        "ClaimState",
        "GroupInfo",
        "ClaimDevice",
        "StrategyInfo",
        "MpsInfo",
        "TimeSliceInterval",
        "ComputeMode",
        "GpuSharing",
        "Attachment",
        "GpuInfo",
        "MigDeviceInfo",
        "MigPartitions",
        "MigCapacity",
        "MigSlot",
        "PodRef",
        "MigInstanceInfo",
        "MigApplyParams",
        "MigApplyResult",
        "MigGpuPlan",
        "DetachResult",
        "HealthInfo",
        "DriverSpecHealth",
        "VersionInfo",
        "ListClaimsResult",
        "ListClaimsParams",
        "ClaimPage",
        "ListGpusResult",
    ];
    for name in wanted {
        assert!(defs.contains_key(name), "$defs lacks {name}");
    }
    for method in Method::ALL {
        for version in VERSIONS {
            let (params, result) = method_defs(method, version);
            for name in params.into_iter().chain([result]) {
                assert!(defs.contains_key(name), "{method}: $defs lacks {name}");
            }
        }
    }
    // And nothing stale: every def is a wire type with a sample below, or a named helper.
    let sampled: BTreeSet<&str> = samples().into_iter().map(|(name, _)| name).collect();
    let helpers = ["UInt32", "UInt64", "Int32", "Method", "Request", "Response"];
    for name in defs.keys() {
        assert!(
            sampled.contains(name.as_str()) || helpers.contains(&name.as_str()),
            "$defs.{name} matches no wire type"
        );
    }
}

#[test]
fn method_enum_lists_exactly_the_protocol_methods() {
    let schema = load_schema();
    let names: Vec<Value> = Method::ALL.iter().map(|m| json!(m.as_str())).collect();
    assert_eq!(enum_values(&schema, "Method"), names);
}

#[test]
fn enums_match_their_serde_names() {
    let schema = load_schema();
    let cases: [(&str, Vec<Value>); 5] = [
        ("ErrorCode", ERROR_CODES.iter().map(to_json).collect()),
        ("ClaimState", CLAIM_STATES.iter().map(to_json).collect()),
        ("TimeSliceInterval", INTERVALS.iter().map(to_json).collect()),
        ("ComputeMode", COMPUTE_MODES.iter().map(to_json).collect()),
        ("GpuSharing", GPU_SHARINGS.iter().map(to_json).collect()),
    ];
    for (def, serialized) in cases {
        assert_eq!(enum_values(&schema, def), serialized, "$defs.{def}");
    }
    // The codes' own wire names agree with serde too.
    for code in ERROR_CODES {
        assert_eq!(to_json(&code), json!(code.as_str()));
    }
}

#[test]
fn samples_of_every_type_validate_with_exactly_the_declared_fields() {
    let schema = load_schema();
    let v = Validator { root: &schema };
    for (def, sample) in samples() {
        let schema = v.def(def);
        let mut errors = v.errors(schema, &sample);
        v.exact_fields(schema, &sample, "$", &mut errors);
        assert!(
            errors.is_empty(),
            "{def} sample {sample}:\n{}",
            errors.join("\n")
        );
    }
}

#[test]
fn requests_and_responses_as_the_rust_client_writes_them_validate() {
    let schema = load_schema();
    let v = Validator { root: &schema };
    for version in VERSIONS {
        for (id, method) in (1u64..).zip(Method::ALL) {
            let request = Request {
                version,
                id,
                method: method.as_str().into(),
                params: params_for(method, version),
            };
            let line = to_json(&request);
            assert_eq!(v.errors(&schema, &line), Vec::<String>::new(), "{line}");
            assert!(v.is_valid(v.def("Request"), &line));
            assert!(!v.is_valid(v.def("Response"), &line));
        }
        let ok = to_json(&Response {
            version,
            id: 3,
            result: Some(json!({"detached": true})),
            error: None,
        });
        assert_eq!(v.errors(v.def("Response"), &ok), Vec::<String>::new());
    }
    for code in ERROR_CODES {
        let refused = to_json(&Response {
            version: OLDEST_PROTOCOL_VERSION,
            id: 0,
            result: None,
            error: Some(ErrorBody {
                code,
                message: "why".into(),
            }),
        });
        assert_eq!(
            v.errors(&schema, &refused),
            Vec::<String>::new(),
            "{refused}"
        );
    }
}

#[test]
fn schema_rejects_what_the_daemon_refuses() {
    let schema = load_schema();
    let v = Validator { root: &schema };
    let request = |extra: Value| {
        let mut line =
            json!({"version": 1, "id": 1, "method": "get_claim", "params": {"uid": UID}});
        for (k, val) in extra.as_object().expect("object") {
            line[k] = val.clone();
        }
        line
    };
    let bad_lines = [
        request(json!({"method": "reboot"})),
        request(json!({"version": 3})),
        request(json!({"version": 0})),
        json!({"version": 1, "id": 1, "method": "list_claims", "params": {"limit": 2}}),
        json!({"version": 2, "id": 1, "method": "list_claims", "params": {"limit": 0}}),
        json!({"version": 2, "id": 1, "method": "list_claims", "params": {"limit": 2, "from": "a"}}),
        json!({"version": 2, "id": 1, "method": "list_claims", "params": {"continue": 7}}),
        json!({"version": 3, "id": 1, "result": {}}),
        request(json!({"id": -1})),
        request(json!({"extra": true})),
        request(json!({"params": {"uid": UID, "force": true}})),
        request(json!({"params": null})),
        json!({"version": 1, "id": 1, "method": "prepare"}),
        json!({"version": 1, "id": 1, "method": "health", "params": {"x": 1}}),
        json!({"version": 1, "id": 1, "method": "attach",
               "params": {"claim_uid": UID, "container_id": "c", "pid": "48213"}}),
        json!({"version": 1, "id": 1, "method": "attach",
               "params": {"claim_uid": UID, "container_id": "c", "pid": 2_147_483_648_u64}}),
        json!({"version": 1, "id": 1}),
        json!({"version": 1, "id": 1, "result": {}, "error": {"code": "Internal", "message": ""}}),
        json!({"version": 1, "id": 1, "result": null}),
        json!({"version": 1, "id": 1, "error": {"code": "Oops", "message": "?"}}),
    ];
    for line in bad_lines {
        assert!(!v.is_valid(&schema, &line), "accepted: {line}");
    }
    let mut mps = to_json(&StrategyInfo::Mps(mps_info()));
    assert!(v.is_valid(v.def("StrategyInfo"), &mps));
    mps["pinned_device_memory_limits"] = json!({"GPU-a": "8G"});
    assert!(
        !v.is_valid(v.def("StrategyInfo"), &mps),
        "UUID keys must not pass"
    );
    assert!(!v.is_valid(v.def("StrategyInfo"), &json!({"strategy": "Mps"})));
    assert!(!v.is_valid(v.def("StrategyInfo"), &json!({"strategy": "TimeSlicing"})));
    let mut claim = to_json(&claim_info(false));
    claim
        .as_object_mut()
        .expect("object")
        .remove("attach_limit");
    assert!(
        !v.is_valid(v.def("ClaimInfo"), &claim),
        "null fields are still present"
    );
}

// ---------------------------------------------------------------------------------------------
// Tests of docs/protocol.md.

fn protocol_md() -> String {
    let path = docs_dir().join("protocol.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The lines of every ```json block, without the `→ ` / `← ` direction marks.
fn example_lines(md: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_json = false;
    for line in md.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_json = !in_json && trimmed == "```json";
            continue;
        }
        if in_json && !trimmed.is_empty() {
            let wire = trimmed
                .strip_prefix("→ ")
                .or_else(|| trimmed.strip_prefix("← "))
                .unwrap_or(trimmed);
            lines.push(wire.to_owned());
        }
    }
    lines
}

/// Decodes `value` as `T` and encodes it again: the example must come back unchanged, so it has
/// no field the type lacks and lacks none it writes.
fn round_trips<T: Serialize + DeserializeOwned>(value: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let again = to_json(&typed);
    if &again == value {
        Ok(())
    } else {
        Err(format!("comes back as {again}"))
    }
}

fn params_round_trip(method: Method, version: u32, params: &Value) -> Result<(), String> {
    match method {
        Method::ListClaims if version >= 2 => round_trips::<ListClaimsParams>(params),
        Method::Prepare => round_trips::<PrepareParams>(params),
        Method::Unprepare | Method::GetClaim => round_trips::<UidParams>(params),
        Method::Attach => round_trips::<AttachParams>(params),
        Method::Detach => round_trips::<DetachParams>(params),
        Method::MigApply => round_trips::<MigApplyParams>(params),
        Method::ListClaims | Method::ListGpus | Method::Health | Method::Version => {
            Err("takes no params".into())
        }
    }
}

fn result_round_trip(method: Method, version: u32, result: &Value) -> Result<(), String> {
    match method {
        Method::ListClaims if version >= 2 => round_trips::<ClaimPage>(result),
        Method::Prepare => round_trips::<PrepareResult>(result),
        Method::Unprepare => round_trips::<UnprepareResult>(result),
        Method::GetClaim => round_trips::<ClaimInfo>(result),
        Method::ListClaims => round_trips::<Vec<ClaimInfo>>(result),
        Method::ListGpus => round_trips::<Vec<GpuInfo>>(result),
        Method::Attach => round_trips::<Attachment>(result),
        Method::Detach => round_trips::<DetachResult>(result),
        Method::Health => round_trips::<HealthInfo>(result),
        Method::Version => round_trips::<VersionInfo>(result),
        Method::MigApply => round_trips::<MigApplyResult>(result),
    }
}

#[test]
fn every_example_line_is_valid_and_matches_the_rust_types() {
    let schema = load_schema();
    let v = Validator { root: &schema };
    let lines = example_lines(&protocol_md());
    assert!(lines.len() >= 2 * Method::ALL.len(), "too few examples");
    let mut pending: Option<(u64, Method, u32)> = None;
    let mut answered = BTreeSet::new();
    for line in &lines {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let errors = v.errors(&schema, &value);
        assert!(errors.is_empty(), "{line}\n{}", errors.join("\n"));
        if value.get("method").is_some() {
            let request: Request = serde_json::from_value(value).expect("a Request");
            let method = Method::parse(&request.method).expect("a known method");
            if let Some(params) = &request.params {
                params_round_trip(method, request.version, params)
                    .unwrap_or_else(|e| panic!("{method} params: {e}: {line}"));
            }
            pending = Some((request.id, method, request.version));
            continue;
        }
        let response: Response = serde_json::from_value(value).expect("a Response");
        if response.id == 0 {
            continue; // an answer to an unreadable line: no request to pair with
        }
        let (id, method, version) = pending
            .take()
            .unwrap_or_else(|| panic!("a response without a request before it: {line}"));
        assert_eq!(
            response.id, id,
            "response id does not echo the request: {line}"
        );
        assert_eq!(
            response.version, version,
            "response version does not echo the request's: {line}"
        );
        if let Some(result) = &response.result {
            let (_, def) = method_defs(method, version);
            let mut errors = v.errors(v.def(def), result);
            v.exact_fields(v.def(def), result, "$", &mut errors);
            assert!(
                errors.is_empty(),
                "{method} result: {}\n{line}",
                errors.join("\n")
            );
            result_round_trip(method, version, result)
                .unwrap_or_else(|e| panic!("{method} result: {e}: {line}"));
        }
        answered.insert(format!("{method} {version}"));
    }
    assert!(pending.is_none(), "a request example without its response");
    for method in Method::ALL {
        assert!(
            answered.contains(&format!("{method} 1")),
            "no example exchange for {method}"
        );
    }
    assert!(
        answered.contains("list_claims 2"),
        "no example of a list_claims page"
    );
}

/// `StrategyInfo` is internally tagged, so serde buffers the object before decoding `MpsInfo`;
/// map keys that are not strings in Rust cannot be read back from that buffer. Guards against
/// `pinned_device_memory_limits` going back to integer keys, which would make every MPS claim
/// with a pinned limit unreadable for Rust clients.
#[test]
fn mps_strategy_with_pinned_limits_round_trips() {
    let line = to_json(&StrategyInfo::Mps(mps_info()));
    let back: StrategyInfo = serde_json::from_value(line).expect("decodes");
    assert_eq!(back, StrategyInfo::Mps(mps_info()));
}

#[test]
fn every_method_and_error_code_is_documented() {
    let md = protocol_md();
    for method in Method::ALL {
        assert!(
            md.contains(&format!("### `{method}`")),
            "protocol.md has no section for {method}"
        );
    }
    for code in ERROR_CODES {
        assert!(
            md.contains(&format!("| `{code}` |")),
            "protocol.md's error table lacks {code}"
        );
    }
    assert!(md.contains(gpushare_proto::DEFAULT_SOCKET));
}
