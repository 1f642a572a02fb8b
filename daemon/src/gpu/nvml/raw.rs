//! The GPU- and compute-instance calls nvml-wrapper does not wrap, made on its raw bindings.

use std::os::raw::{c_char, c_uint};

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstance_t, NVML_GPU_INSTANCE_PROFILE_COUNT,
};

use crate::gpu::{ComputeInstance, MigInstance};
use crate::mig::{GiProfileId, MigPlacement};

/// GPU instances per GPU at most (A100/H100: 7 one-slice instances; 8 leaves room).
const MAX_INSTANCES: usize = 8;

fn gi_by_id(nvml: &Nvml, dev: &Device<'static>, id: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `dev` is a live handle of this never-shut-down NVML; `gi` is a live local.
    unsafe { nvml_try(f(dev.handle(), id, &mut gi))? };
    Ok(gi)
}

fn compute_instances(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
) -> Result<Vec<nvmlComputeInstance_t>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let mut out = Vec::new();
    // CI profile indexes 0..=8 (1 slice … 7 slices NVL).
    for profile in 0..9 {
        let mut cis: [nvmlComputeInstance_t; MAX_INSTANCES] = [std::ptr::null_mut(); MAX_INSTANCES];
        let mut count: c_uint = 0;
        // SAFETY: `gi` came from NVML; `cis` has room for MAX_INSTANCES handles and
        // NVML writes at most that many (a GI holds at most 7 CIs); `count` is live.
        let r = unsafe { nvml_try(list(gi, profile, cis.as_mut_ptr(), &mut count)) };
        match r {
            Ok(()) => out.extend_from_slice(&cis[..(count as usize).min(MAX_INSTANCES)]),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn ci_info(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(u32, String), NvmlError> {
    let info_of = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let uuid_of = nvml_sym(nvml.lib().nvmlDeviceGetUUID.as_ref())?;
    // SAFETY: zeroed is a valid value of this plain C struct (integers and pointers).
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    let mut buf = [0 as c_char; 96];
    // SAFETY: `ci` came from NVML; `info` is a live local of the named type; `info.device`
    // is the MIG device handle NVML filled in, and `buf`'s length is passed with it.
    unsafe {
        nvml_try(info_of(ci, &mut info))?;
        nvml_try(uuid_of(info.device, buf.as_mut_ptr(), buf.len() as c_uint))?;
    }
    // SAFETY: NVML wrote a NUL-terminated string into `buf` (it fails rather than
    // truncating without NUL).
    let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok((info.id, uuid))
}

/// Every GPU instance of `dev`, with its first compute instance.
pub(super) fn instances(nvml: &Nvml, dev: &Device<'static>) -> Result<Vec<MigInstance>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let info_of = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut out = Vec::new();
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        let Ok(profile) = dev.profile_info(index) else {
            continue;
        };
        let mut gis: [nvmlGpuInstance_t; MAX_INSTANCES] = [std::ptr::null_mut(); MAX_INSTANCES];
        let mut count: c_uint = 0;
        // SAFETY: `dev` is live; `gis` has room for MAX_INSTANCES handles, more than a
        // GPU holds of one profile (7); `count` is a live local.
        unsafe { nvml_try(list(dev.handle(), profile.id, gis.as_mut_ptr(), &mut count))? };
        for &gi in &gis[..(count as usize).min(MAX_INSTANCES)] {
            // SAFETY: zeroed is a valid value of this plain C struct.
            let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `gi` came from NVML just now; `info` is a live local.
            unsafe { nvml_try(info_of(gi, &mut info))? };
            let compute = match compute_instances(nvml, gi)?.first() {
                Some(&ci) => {
                    let (ci_id, uuid) = ci_info(nvml, ci)?;
                    Some(ComputeInstance { ci_id, uuid })
                }
                None => None,
            };
            out.push(MigInstance {
                gi_id: info.id,
                profile: GiProfileId(info.profileId),
                placement: MigPlacement {
                    start: info.placement.start,
                    size: info.placement.size,
                },
                compute,
            });
        }
    }
    out.sort_by_key(|i| i.gi_id);
    Ok(out)
}

/// Creates a GPU instance of profile ID `profile_id` at `start`; returns its GI ID.
pub(super) fn create_gi(
    nvml: &Nvml,
    dev: &Device<'static>,
    profile_id: u32,
    placement: MigPlacement,
) -> Result<u32, NvmlError> {
    let create = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let info_of = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let MigPlacement { start, size } = placement;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: zeroed is a valid value of this plain C struct.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `dev` is live; `placement`, `gi` and `info` are live locals of the types
    // the C signatures name.
    unsafe {
        nvml_try(create(dev.handle(), profile_id, &placement, &mut gi))?;
        nvml_try(info_of(gi, &mut info))?;
    }
    Ok(info.id)
}

/// Creates a compute instance of CI profile index `ci_profile` in GI `gi_id`.
pub(super) fn create_ci(
    nvml: &Nvml,
    dev: &Device<'static>,
    gi_id: u32,
    ci_profile: u32,
) -> Result<ComputeInstance, NvmlError> {
    let profile_info = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let create = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let gi = gi_by_id(nvml, dev, gi_id)?;
    // SAFETY: zeroed is a valid value of this plain C struct.
    let mut info: nvml_wrapper_sys::bindings::nvmlComputeInstanceProfileInfo_t =
        unsafe { std::mem::zeroed() };
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` came from NVML; `info` and `ci` are live locals of the named types.
    unsafe {
        nvml_try(profile_info(
            gi,
            ci_profile,
            nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        ))?;
        nvml_try(create(gi, info.id, &mut ci))?;
    }
    let (ci_id, uuid) = ci_info(nvml, ci)?;
    Ok(ComputeInstance { ci_id, uuid })
}

/// Destroys compute instance `ci_id` of GI `gi_id`.
pub(super) fn destroy_ci(
    nvml: &Nvml,
    dev: &Device<'static>,
    gi_id: u32,
    ci_id: u32,
) -> Result<(), NvmlError> {
    let by_id = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
    let destroy = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    let gi = gi_by_id(nvml, dev, gi_id)?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` came from NVML; `ci` is a live local; the handle is destroyed once.
    unsafe {
        nvml_try(by_id(gi, ci_id, &mut ci))?;
        nvml_try(destroy(ci))
    }
}

/// Destroys GI `gi_id` (its compute instances must be gone).
pub(super) fn destroy_gi(nvml: &Nvml, dev: &Device<'static>, gi_id: u32) -> Result<(), NvmlError> {
    let destroy = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    let gi = gi_by_id(nvml, dev, gi_id)?;
    // SAFETY: `gi` came from NVML just now and is destroyed once.
    unsafe { nvml_try(destroy(gi)) }
}
