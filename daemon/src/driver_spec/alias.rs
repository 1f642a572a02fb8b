//! Names a claim's MIG slice keeps in the driver's CDI spec after the slice was made again.
//!
//! A prepare hands kubelet `gpushare.io/gpu=MIG-<uuid>` for a MIG slice, and kubelet keeps the
//! IDs it was handed for the claim's whole life: it never prepares a claim again that it has
//! checkpointed as prepared, so a container restarted after a GPU reset or a reboot asks for
//! the same IDs. The recreated slice has a new MIG UUID (they are never reused), and the
//! generator (NVIDIA's `nvidia-ctk cdi generate`) names only the devices that exist. So the
//! spec gpushared installs adds, for each slice a claim still holds under its first name, a
//! device of that name whose edits are those the generator wrote for the slice's device now:
//! NVIDIA's own edits (the parent GPU's node and the slice's capability nodes), never ours.
//! The old name can never collide with a live device: a MIG UUID is never handed out twice.

use std::collections::BTreeMap;

use gpushare_cdi::{Device, Spec};

/// `generated` with, for each `(alias, target)` of `aliases`, a device named `alias` that has
/// the edits of `generated`'s device `target`; the spec at the lowest version that fits.
/// Returns it with the aliases left out, by name with why: no device `target` in the spec (the
/// slice is not there now: gpushared is recreating it, or it was lost), a device of its own
/// named `alias` (which then wins), or a name CDI does not allow.
pub fn with_aliases(
    generated: &Spec,
    aliases: &BTreeMap<String, String>,
) -> (Spec, BTreeMap<String, String>) {
    let mut spec = generated.clone();
    let mut left_out = BTreeMap::new();
    for (alias, target) in aliases {
        if let Err(e) = gpushare_cdi::validate_device_name(alias) {
            left_out.insert(alias.clone(), e.to_string());
            continue;
        }
        if generated.devices.iter().any(|d| &d.name == alias) {
            left_out.insert(
                alias.clone(),
                "the generator wrote a device of that name itself (a MIG UUID handed out twice)"
                    .into(),
            );
            continue;
        }
        let Some(device) = generated.devices.iter().find(|d| &d.name == target) else {
            left_out.insert(alias.clone(), format!("the spec has no device {target}"));
            continue;
        };
        spec.devices.push(Device {
            name: alias.clone(),
            ..device.clone()
        });
    }
    spec.cdi_version = gpushare_cdi::minimum_version(&spec).to_string();
    (spec, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_cdi::{ContainerEdits, DeviceNode};

    fn device(name: &str, node: &str) -> Device {
        Device {
            name: name.into(),
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: node.into(),
                    ..DeviceNode::default()
                }],
                ..ContainerEdits::default()
            },
            ..Device::default()
        }
    }

    #[test]
    fn an_alias_gets_its_targets_edits_and_nothing_else_changes() {
        let generated = Spec {
            cdi_version: "0.3.0".into(),
            kind: "gpushare.io/gpu".into(),
            devices: vec![
                device("GPU-1", "/dev/nvidia2"),
                device("MIG-new", "/dev/nvidia-caps/nvidia-cap282"),
            ],
            ..Spec::default()
        };
        let aliases = BTreeMap::from([
            ("MIG-old".to_string(), "MIG-new".to_string()),
            ("MIG-gone".to_string(), "MIG-absent".to_string()),
            ("GPU-1".to_string(), "MIG-new".to_string()),
            ("-bad".to_string(), "MIG-new".to_string()),
        ]);
        let (spec, left_out) = with_aliases(&generated, &aliases);
        gpushare_cdi::validate_spec(&spec).unwrap();
        let old = spec.devices.iter().find(|d| d.name == "MIG-old").unwrap();
        assert_eq!(old.container_edits, generated.devices[1].container_edits);
        assert_eq!(spec.devices.len(), 3, "{spec:?}");
        assert_eq!(spec.devices[..2], generated.devices[..]);
        assert_eq!(left_out.len(), 3, "{left_out:?}");
        assert_eq!(left_out["MIG-gone"], "the spec has no device MIG-absent");
        assert!(left_out["GPU-1"].starts_with("the generator wrote"));
        assert!(left_out.contains_key("-bad"));
        let (same, none) = with_aliases(&generated, &BTreeMap::new());
        assert_eq!(same.devices, generated.devices);
        assert!(none.is_empty());
    }
}
