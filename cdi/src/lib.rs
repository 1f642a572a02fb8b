//! CDI (Container Device Interface) for gpushare: the spec model, strict loading, validation,
//! qualified names, a registry over spec directories, and application of container edits to
//! an OCI runtime config.
//!
//! The behaviour follows the CNCF CDI specification and its reference Go library
//! (<https://github.com/cncf-tags/container-device-interface>: `SPEC.md`,
//! `specs-go/version.go`, `pkg/cdi`): versions 0.1.0 to 1.1.0, strict decoding (unknown
//! fields refused), spec directories with priorities and conflicts, and the edit semantics of
//! the reference `InjectDevices`. The crate is synchronous and does no I/O beyond reading spec
//! files and `lstat`ing host device nodes.
//!
//! ```no_run
//! use gpushare_cdi::Registry;
//!
//! let registry = Registry::load_default();
//! let mut config: serde_json::Value =
//!     serde_json::from_str(&std::fs::read_to_string("config.json").unwrap()).unwrap();
//! registry.inject(&mut config, &["gpushare.io/claim=abc"]).unwrap();
//! ```

mod apply;
mod decode;
mod model;
mod name;
mod registry;
mod validate;
mod version;

pub use apply::{
    apply_edits, apply_edits_with, fill_device_node, mount_depth, ApplyError, HostDeviceInfo,
    HostDevices, HostFs,
};
pub use decode::{load_spec, load_spec_file, parse_spec, SpecFormat};
pub use model::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
pub use name::{
    is_qualified_name, parse_kind, qualified_name, validate_class_name, validate_device_name,
    validate_vendor_name, NameError, QualifiedName,
};
pub use registry::{
    InjectError, LoadedSpec, Registry, RegistryError, ResolveError, DEFAULT_SPEC_DIRS,
};
pub use validate::{
    validate_annotations, validate_edits, validate_env, validate_spec, EditsError, SpecError,
    HOOK_NAMES, NO_PERMISSIONS,
};
pub use version::{minimum_version, UnknownVersion, Version};
