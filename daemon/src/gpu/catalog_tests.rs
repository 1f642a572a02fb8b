//! Unit tests of `catalog.rs`.

use super::*;

#[test]
fn catalog_has_the_issue_s_instance_types() {
    let names: Vec<String> = catalog().unwrap().into_iter().map(|p| p.name).collect();
    for want in [
        "g4dn.xlarge",
        "g5.xlarge",
        "g5.48xlarge",
        "g6.xlarge",
        "g6e.xlarge",
        "p3.2xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p6-b200.48xlarge",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
}

#[test]
fn p4d_is_eight_a100_40gb_on_two_numa_nodes() {
    let p = resolve("p4d.24xlarge").unwrap();
    let gpus = p.gpus("node");
    assert_eq!(gpus.len(), 8);
    assert!(gpus
        .iter()
        .all(|g| g.product_name == "NVIDIA A100-SXM4-40GB"
            && g.memory_mib == 40960
            && g.compute_capability == (8, 0)
            && g.mig_capable
            && !g.mig_enabled));
    let numa: Vec<_> = gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(numa[..4], [Some(0); 4]);
    assert_eq!(numa[4..], [Some(1); 4]);
}

#[test]
fn unknown_name_lists_the_catalog() {
    let e = resolve("p9.huge").unwrap_err().to_string();
    assert!(e.contains("p4d.24xlarge") && e.contains("p9.huge"), "{e}");
}

#[test]
fn profile_file_with_mig_devices() {
    let text = r#"
name = "lab-a100"
driver_version = "550.90.07"
cuda_driver_version = "12.4"
[[gpus]]
product_name = "NVIDIA A100-SXM4-40GB"
architecture = "Ampere"
memory_mib = 40960
cuda_compute_capability = "8.0"
mig_capable = true
mig_enabled = true
count = 1
[[gpus.mig_devices]]
profile = "3g.20gb"
gi_profile_id = 9
placement_start = 4
memory_slices = 4
memory_mib = 19968
multiprocessors = 42
copy_engines = 3
decoders = 2
[[gpus]]
product_name = "Tesla T4"
brand = "Tesla"
architecture = "Turing"
memory_mib = 15360
cuda_compute_capability = "7.5"
count = 2
pci_bus_ids = ["00000000:3B:00.0", "00000000:5E:00.0"]
"#;
    let p = NodeProfile::parse(text, Path::new("lab.toml")).unwrap();
    let gpus = p.gpus("n");
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[0].mig_devices.len(), 1);
    assert_eq!(
        gpus[0].mig_devices[0].device_name(0),
        "gpu-0-mig-3g20gb-9-4"
    );
    assert!(gpus[0].mig_devices[0].uuid.starts_with("MIG-"));
    assert_eq!(gpus[2].minor, 2);
    assert_eq!(gpus[2].pci_bus_id, "00000000:5E:00.0");
    assert_eq!(gpus[2].driver_version, "550.90.07");
}

#[test]
fn bad_profiles_are_refused_with_the_reason() {
    let base = "name = \"x\"\n[[gpus]]\nproduct_name = \"P\"\narchitecture = \"A\"\nmemory_mib = 1024\ncuda_compute_capability = \"8.0\"\n";
    for (extra, needle) in [
            ("count = 0\n", "0 GPUs"),
            ("count = 1\nmig_enabled = true\n", "mig_enabled needs mig_capable"),
            ("count = 1\nmemry_mib = 3\n", "memry_mib"),
            ("count = 2\npci_bus_ids = [\"a\"]\n", "1 pci_bus_ids for 2 GPUs"),
            (
                "count = 1\nmig_capable = true\nmig_enabled = true\n[[gpus.mig_devices]]\nprofile = \"a\"\ngi_profile_id = 9\nplacement_start = 6\nmemory_slices = 4\nmemory_mib = 10\nmultiprocessors = 1\n",
                "outside the 8 memory slices",
            ),
        ] {
            let e = NodeProfile::parse(&format!("{base}{extra}"), Path::new("f.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{extra:?}: {e}");
        }
    let e = NodeProfile::parse(
        &format!("{}count = 1\n", base.replace("\"8.0\"", "\"eight\"")),
        Path::new("f"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("must be major.minor"), "{e}");
}

#[test]
fn uuids_are_deterministic_and_per_node() {
    let a = simulated_uuid("node-a", 0);
    assert_eq!(a, simulated_uuid("node-a", 0));
    assert_ne!(a, simulated_uuid("node-b", 0));
    assert_ne!(a, simulated_uuid("node-a", 1));
    assert_eq!(a.len(), 40);
    assert!(a.starts_with("GPU-"));
}
