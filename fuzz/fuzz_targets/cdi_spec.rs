//! The CDI spec loader (JSON and YAML, strict) and the editor that applies a device's
//! container edits to an OCI config, with device nodes answered by a fake host.
#![no_main]

use std::io;
use std::path::Path;

use gpushare_cdi::{apply_edits_with, load_spec, HostDeviceInfo, HostDevices, SpecFormat};
use libfuzzer_sys::fuzz_target;

/// Every path is a character device 195:N: no host file system is touched.
struct FakeHost;

impl HostDevices for FakeHost {
    fn device_info(&self, path: &Path) -> io::Result<HostDeviceInfo> {
        Ok(HostDeviceInfo {
            device_type: "c",
            major: 195,
            minor: path.as_os_str().len() as i64,
            file_mode: 0o666,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    for format in [SpecFormat::Json, SpecFormat::Yaml] {
        let Ok(spec) = load_spec(data, format) else {
            continue;
        };
        let mut config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
            "linux": {}
        });
        let _ = apply_edits_with(&mut config, &spec.container_edits, &FakeHost);
        for device in &spec.devices {
            let _ = apply_edits_with(&mut config, &device.container_edits, &FakeHost);
        }
        serde_json::to_vec(&config).expect("an edited config encodes");
    }
});
