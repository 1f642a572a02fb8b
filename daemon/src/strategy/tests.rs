//! Each strategy's GPU setting on a simulated node: set up, checked again at start, restored
//! by the last holder; a strategy that needs no setting changes nothing.

use std::path::Path;

use gpushare_core::Want;
use gpushare_proto::{ComputeMode, ErrorCode, TimeSliceInterval};

use super::*;
use crate::gpu::SimulatedBackend;

fn backend() -> SimulatedBackend {
    SimulatedBackend::without_device_nodes("p4d.24xlarge", "node-a", Path::new("/x"))
        .expect("simulated node")
}

/// (compute mode, time-slice interval) of `uuid`.
fn settings(b: &SimulatedBackend, uuid: &str) -> (ComputeMode, TimeSliceInterval) {
    (
        b.compute_mode(uuid).expect("simulated"),
        b.time_slice(uuid).expect("simulated"),
    )
}

const DEFAULTS: (ComputeMode, TimeSliceInterval) =
    (ComputeMode::Default, TimeSliceInterval::Default);

#[test]
fn time_slicing_sets_checks_again_and_restores_its_interval() {
    let b = backend();
    let uuid = b.gpus()[0].uuid.clone();
    let s = TimeSlicing {
        interval: TimeSliceInterval::Long,
    };
    s.set_up(&b, &uuid, "gpu-0").expect("simulated");
    assert_eq!(
        settings(&b, &uuid),
        (ComputeMode::Default, TimeSliceInterval::Long)
    );
    // Lost while gpushared was down: set again at start.
    b.set_time_slice(&uuid, TimeSliceInterval::Short)
        .expect("simulated");
    s.check_again(&b, &uuid, "gpu-0");
    assert_eq!(b.time_slice(&uuid).ok(), Some(TimeSliceInterval::Long));
    s.restore(&b, &uuid, "gpu-0");
    assert_eq!(settings(&b, &uuid), DEFAULTS);
}

#[test]
fn mps_sets_checks_again_and_restores_exclusive_process() {
    let b = backend();
    let uuid = b.gpus()[1].uuid.clone();
    Mps.set_up(&b, &uuid, "gpu-1").expect("simulated");
    assert_eq!(
        settings(&b, &uuid),
        (ComputeMode::ExclusiveProcess, TimeSliceInterval::Default)
    );
    b.set_compute_mode(&uuid, ComputeMode::Default)
        .expect("simulated");
    Mps.check_again(&b, &uuid, "gpu-1");
    assert_eq!(
        b.compute_mode(&uuid).ok(),
        Some(ComputeMode::ExclusiveProcess)
    );
    Mps.restore(&b, &uuid, "gpu-1");
    assert_eq!(settings(&b, &uuid), DEFAULTS);
}

#[test]
fn exclusive_and_mig_leave_the_gpu_as_it_is() {
    let b = backend();
    let uuid = b.gpus()[2].uuid.clone();
    for s in [of_want(Want::Exclusive), of_want(Want::Mig)] {
        s.set_up(&b, &uuid, "gpu-2").expect("nothing to set");
        b.set_time_slice(&uuid, TimeSliceInterval::Medium)
            .expect("simulated");
        s.check_again(&b, &uuid, "gpu-2");
        s.restore(&b, &uuid, "gpu-2");
        assert_eq!(
            settings(&b, &uuid),
            (ComputeMode::Default, TimeSliceInterval::Medium),
            "untouched"
        );
        b.set_time_slice(&uuid, TimeSliceInterval::Default)
            .expect("simulated");
    }
}

#[test]
fn a_refused_setting_names_the_setting_and_the_device() {
    let b = backend();
    let e = TimeSlicing {
        interval: TimeSliceInterval::Short,
    }
    .set_up(&b, "GPU-none", "gpu-9")
    .expect_err("no such GPU");
    // One mapping of the backend's errors (ServiceError::gpu): both strategies answer the
    // same code for the same refusal (they disagreed before: Internal and Unsupported).
    assert_eq!(e.code, ErrorCode::UnknownDevice);
    assert!(
        e.message.starts_with("setting time-slice Short on gpu-9: "),
        "{}",
        e.message
    );
    let e = Mps
        .set_up(&b, "GPU-none", "gpu-9")
        .expect_err("no such GPU");
    assert_eq!(e.code, ErrorCode::UnknownDevice);
    assert!(
        e.message
            .starts_with("setting compute mode EXCLUSIVE_PROCESS on gpu-9: "),
        "{}",
        e.message
    );
}

#[test]
fn admission_words_name_their_strategy() {
    let b = backend();
    let uuid = b.gpus()[3].uuid.clone();
    of_want(Want::TimeSliced(TimeSliceInterval::Long.as_int()))
        .set_up(&b, &uuid, "gpu-3")
        .expect("simulated");
    assert_eq!(b.time_slice(&uuid).ok(), Some(TimeSliceInterval::Long));
    of_want(Want::Mps)
        .set_up(&b, &uuid, "gpu-3")
        .expect("simulated");
    assert_eq!(
        b.compute_mode(&uuid).ok(),
        Some(ComputeMode::ExclusiveProcess)
    );
}
