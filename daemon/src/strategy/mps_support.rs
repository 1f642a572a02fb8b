//! Where NVIDIA's MPS can keep its promise, pure. Per NVIDIA's MPS documentation and
//! `nvidia-cuda-mps-control(1)`: the active thread percentage and pinned device memory limits
//! are Volta (compute capability 7.0) features, and pre-Volta MPS servers fail at start in the
//! field ("Legacy Server … Failed to start : invalid argument" on a Tesla P4 at 6.1,
//! NVIDIA/k8s-device-plugin#685); pinned device memory limits need a driver of CUDA 11.5 or
//! newer. A claim that asks for more than the GPU honours is refused up front instead of being
//! prepared with limits the hardware ignores.

use gpushare_proto::ErrorCode;

use crate::config::MpsSettings;
use crate::error::ServiceError;
use crate::gpu::Gpu;

/// The lowest compute capability whose MPS gpushare serves (Volta).
pub const MIN_COMPUTE_CAPABILITY: (u32, u32) = (7, 0);

/// The lowest CUDA driver version (`major.minor`) that honours pinned device memory limits.
pub const PINNED_LIMITS_MIN_CUDA: (u32, u32) = (11, 5);

fn describe(gpu: &Gpu) -> String {
    format!(
        "{} ({}, compute capability {}.{}, driver {}, CUDA {})",
        gpu.device_name(),
        gpu.product_name,
        gpu.compute_capability.0,
        gpu.compute_capability.1,
        gpu.driver_version,
        gpu.cuda_driver_version
    )
}

fn cuda_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Why MPS on a GPU cannot keep what a claim asks ([`check`]); the caller answers
/// `Unsupported` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpsUnsupported {
    /// The GPU is older than [`MIN_COMPUTE_CAPABILITY`] (Volta).
    #[error("MPS on {gpu} is not supported: NVIDIA's MPS enforces active thread percentages and pinned memory limits only on compute capability {}.{} (Volta) or newer, and its servers fail at start on older GPUs; use time-slicing or a whole GPU", MIN_COMPUTE_CAPABILITY.0, MIN_COMPUTE_CAPABILITY.1)]
    BeforeVolta {
        /// The GPU: its name, product, compute capability, driver and CUDA versions.
        gpu: String,
    },
    /// The claim sets pinned device memory limits and the driver is older than
    /// [`PINNED_LIMITS_MIN_CUDA`].
    #[error("MPS pinned device memory limits on {gpu} are not supported: they need a driver of CUDA {}.{} or newer; upgrade the driver or leave out the pinned memory limits", PINNED_LIMITS_MIN_CUDA.0, PINNED_LIMITS_MIN_CUDA.1)]
    PinnedLimits {
        /// The GPU: its name, product, compute capability, driver and CUDA versions.
        gpu: String,
    },
}

/// Checks that an MPS control daemon on `gpu` (the parent GPU of a MIG device) keeps what the
/// claim asks: MPS at all, and `pinned_limits` when the claim sets any.
///
/// # Errors
/// [`MpsUnsupported`], naming the GPU, its compute capability and driver: the caller answers
/// `Unsupported`.
pub fn check(gpu: &Gpu, pinned_limits: bool) -> Result<(), MpsUnsupported> {
    if gpu.compute_capability < MIN_COMPUTE_CAPABILITY {
        return Err(MpsUnsupported::BeforeVolta { gpu: describe(gpu) });
    }
    if pinned_limits {
        if let Some(cuda) = cuda_version(&gpu.cuda_driver_version) {
            if cuda < PINNED_LIMITS_MIN_CUDA {
                return Err(MpsUnsupported::PinnedLimits { gpu: describe(gpu) });
            }
        }
    }
    Ok(())
}

/// [`check`] for each of `gpus` under `settings`, as a prepare answers it.
///
/// # Errors
/// `Unsupported`, with [`MpsUnsupported`]'s message for the first GPU that cannot keep them.
pub fn check_gpus(gpus: &[&Gpu], settings: &MpsSettings) -> Result<(), ServiceError> {
    let pinned = settings.default_pinned_limit_mib.is_some()
        || !settings.per_device_pinned_limit_mib.is_empty();
    for gpu in gpus {
        check(gpu, pinned).map_err(|e| ServiceError::new(ErrorCode::Unsupported, e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(cc: (u32, u32), cuda: &str) -> Gpu {
        let mut g = crate::gpu::catalog::resolve("p3.2xlarge")
            .unwrap()
            .gpus("n")[0]
            .clone();
        g.compute_capability = cc;
        g.cuda_driver_version = cuda.into();
        g
    }

    #[test]
    fn volta_is_the_floor_and_cuda_11_5_for_pinned_limits() {
        assert!(check(&gpu((7, 0), "11.4"), false).is_ok());
        assert!(check(&gpu((7, 0), "11.5"), true).is_ok());
        assert!(check(&gpu((9, 0), "12.8"), true).is_ok());
        assert!(check(&gpu((10, 0), "13.0"), true).is_ok());
        assert!(check(&gpu((6, 1), "12.2"), false)
            .unwrap_err()
            .to_string()
            .contains("compute capability 6.1"));
        assert!(check(&gpu((7, 0), "11.4"), true)
            .unwrap_err()
            .to_string()
            .contains("CUDA 11.4"));
        assert!(check(&gpu((7, 0), "10.2"), true).is_err());
        // An unreadable CUDA version is not taken for an old one.
        assert!(check(&gpu((7, 0), ""), true).is_ok());
    }

    /// The `Unsupported` answers' messages, as they were when they were strings.
    #[test]
    fn the_refusals_name_the_gpu_and_what_it_lacks() {
        let old = gpu((6, 1), "12.2");
        let e = check(&old, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "MPS on {} is not supported: NVIDIA's MPS enforces active thread percentages and pinned memory limits only on compute capability 7.0 (Volta) or newer, and its servers fail at start on older GPUs; use time-slicing or a whole GPU",
                describe(&old)
            )
        );
        let driver = gpu((7, 0), "11.4");
        let e = check(&driver, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "MPS pinned device memory limits on {} are not supported: they need a driver of CUDA 11.5 or newer; upgrade the driver or leave out the pinned memory limits",
                describe(&driver)
            )
        );
    }
}
