//! Unit tests of `daemon_config.rs`.

use super::*;

#[test]
fn shipped_default_file_is_the_default() {
    let parsed = DaemonConfig::parse(DEFAULT_CONFIG, Path::new("default")).unwrap();
    assert_eq!(parsed, DaemonConfig::default());
}

#[test]
fn empty_file_is_the_default() {
    assert_eq!(
        DaemonConfig::parse("", Path::new("x")).unwrap(),
        DaemonConfig::default()
    );
}

#[test]
fn unknown_keys_are_named() {
    let e = DaemonConfig::parse("[mps]\ntimeout_secnds = 3\n", Path::new("/etc/x.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeout_secnds"), "{e}");
    assert!(e.contains("/etc/x.toml"), "{e}");
    let e = DaemonConfig::parse("[mystery]\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mystery"), "{e}");
}

#[test]
fn values_are_checked() {
    let e = DaemonConfig::parse("[socket]\nmode = \"0999\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("socket.mode"), "{e}");
    let e = DaemonConfig::parse("[socket]\nmax_connections = 0\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("socket.max_connections"), "{e}");
    for (text, key) in [
        ("max_connections = 8\n", "socket.reserved_connections"),
        (
            "max_connections = 64\nreserved_connections = 64\n",
            "socket.reserved_connections",
        ),
        (
            "max_connections_per_uid = 0\n",
            "socket.max_connections_per_uid",
        ),
        (
            "first_request_timeout_seconds = 0\n",
            "socket.first_request_timeout_seconds",
        ),
    ] {
        let e = DaemonConfig::parse(&format!("[socket]\n{text}"), Path::new("x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    let cfg = DaemonConfig::parse(
            "[socket]\nmax_connections = 8\nreserved_connections = 2\nmax_connections_per_uid = 3\nfirst_request_timeout_seconds = 2\n",
            Path::new("x"),
        )
        .unwrap();
    assert_eq!(
        (
            cfg.socket.reserved_connections,
            cfg.socket.max_connections_per_uid,
            cfg.socket.first_request_timeout_seconds
        ),
        (2, 3, 2)
    );
    let e = DaemonConfig::parse("[socket]\ngroup = \"\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("socket.group"), "{e}");
    let e = DaemonConfig::parse("[mps]\ntimeout_seconds = 0\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mps.timeout_seconds"), "{e}");
    let e = DaemonConfig::parse("[mps]\ntimeout_seconds = \"ten\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeout_seconds"), "{e}");
}

#[test]
fn keys_are_read() {
    let cfg = DaemonConfig::parse(
        "[socket]\nmode = \"0600\"\nchanging_uids = [1000]\n[gpus]\nsimulate = \"g5.xlarge\"\n",
        Path::new("x"),
    )
    .unwrap();
    assert_eq!(parse_mode(&cfg.socket.mode).unwrap(), 0o600);
    assert_eq!(cfg.socket.changing_uids, vec![1000]);
    assert_eq!(cfg.gpus.simulate, "g5.xlarge");
    assert!(cfg.gpus.manage_compute_mode);
    let cfg = DaemonConfig::parse(
        "[gpus]\nmanage_compute_mode = false\nmanage_time_slice = false\n",
        Path::new("x"),
    )
    .unwrap();
    assert!(!cfg.gpus.manage_compute_mode && !cfg.gpus.manage_time_slice);
    let e = DaemonConfig::parse("[gpus]\nnvidia_smi_timeout_seconds = 0\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpus.nvidia_smi_timeout_seconds"), "{e}");
}

#[test]
fn metrics_and_log_sections() {
    let cfg = DaemonConfig::parse(
            "[metrics]\nenabled = false\naddress = \"[::1]:9999\"\n[log]\nlevel = \"debug,gpushare::server=trace\"\n",
            Path::new("x"),
        )
        .unwrap();
    assert!(!cfg.metrics.enabled);
    assert_eq!(cfg.metrics.address, "[::1]:9999");
    assert_eq!(cfg.log.level, "debug,gpushare::server=trace");
    let e = DaemonConfig::parse("[metrics]\naddress = \"0.0.0.0:9471\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("metrics.address") && e.contains("allow_non_loopback"),
        "{e}"
    );
    DaemonConfig::parse(
        "[metrics]\naddress = \"0.0.0.0:9471\"\nallow_non_loopback = true\n",
        Path::new("x"),
    )
    .unwrap();
    let e = DaemonConfig::parse("[metrics]\naddress = \"localhost\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("metrics.address"), "{e}");
    let e = DaemonConfig::parse("[log]\nlevel = \"info,=[\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("log.level"), "{e}");
    let e = DaemonConfig::parse("[log]\nlvl = \"info\"\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("lvl"), "{e}");
}

#[test]
fn cdi_section() {
    let cfg = DaemonConfig::parse(
        "[cdi]\ndriver_spec = \"none\"\ndriver_root = \"/run/nvidia/driver\"\n",
        Path::new("x"),
    )
    .unwrap();
    assert_eq!(cfg.cdi.driver_spec, DriverSpecMode::None);
    assert_eq!(cfg.cdi.driver_root, PathBuf::from("/run/nvidia/driver"));
    assert_eq!(
        DaemonConfig::default().cdi.driver_spec,
        DriverSpecMode::Toolkit
    );
    for (text, key) in [
        ("[cdi]\ndriver_spec = \"nvidia\"\n", "driver_spec"),
        ("[cdi]\ndriver_root = \"relative\"\n", "cdi.driver_root"),
        ("[cdi]\ndriver_kind = \"gpushare.io\"\n", "cdi.driver_kind"),
        (
            "[cdi]\ndriver_kind = \"gpushare.io/claim\"\n",
            "cdi.driver_kind",
        ),
        (
            "[cdi]\ngenerate_timeout_seconds = 0\n",
            "cdi.generate_timeout_seconds",
        ),
        (
            "[cdi]\ngenerate_timeout_seconds = 60\n",
            "cdi.generate_timeout_seconds",
        ),
    ] {
        let e = DaemonConfig::parse(text, Path::new("x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn a_generation_is_bounded_below_the_plugins_claim_timeout() {
    // A prepare may wait on a generation; the DRA plugin gives a whole prepare 30 s by
    // default, so a generation that may take as long would be cut off and retried by kubelet
    // while it still runs.
    let default = DaemonConfig::default().cdi.generate_timeout_seconds;
    assert!(default < 30, "{default}");
    DaemonConfig::parse("[cdi]\ngenerate_timeout_seconds = 25\n", Path::new("x")).unwrap();
    let e = DaemonConfig::parse("[cdi]\ngenerate_timeout_seconds = 30\n", Path::new("x"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cdi.generate_timeout_seconds")
            && e.contains("30")
            && e.contains("claim_timeout_seconds"),
        "{e}"
    );
}

/// The messages config errors and gpushared's flags show, with the parse error kept as the
/// source.
#[test]
fn mode_and_metrics_address_errors_say_what_is_wrong() {
    assert_eq!(parse_mode("0660").unwrap(), 0o660);
    let e = parse_mode("0968").unwrap_err();
    assert!(matches!(e, ModeError::NotOctal { .. }), "{e:?}");
    let source = std::error::Error::source(&e).expect("the parse error");
    assert_eq!(
        e.to_string(),
        format!(r#""0968" is not an octal mode: {source}"#)
    );
    let e = parse_mode("17777").unwrap_err();
    assert_eq!(e.to_string(), r#""17777" has bits beyond 07777"#);

    let mut m = MetricsConfig {
        address: "localhost:9471".into(),
        ..MetricsConfig::default()
    };
    let e = check_metrics_address(&m).unwrap_err();
    assert!(std::error::Error::source(&e).is_some());
    assert!(
        e.to_string()
            .starts_with(r#""localhost:9471" is not host:port: "#),
        "{e}"
    );
    m.address = "0.0.0.0:9471".into();
    assert_eq!(
        check_metrics_address(&m).unwrap_err().to_string(),
        "0.0.0.0:9471 is not a loopback address; set metrics.allow_non_loopback = true to serve it"
    );
    m.allow_non_loopback = true;
    assert!(check_metrics_address(&m).is_ok());
}

#[test]
fn run_and_state_may_share_a_directory_the_cdi_directory_may_not() {
    let p = Path::new;
    check_layout(p("/run/gpushare"), p("/var/lib/gpushare"), p("/run/cdi")).unwrap();
    check_layout(p("/tmp/gs"), p("/tmp/gs"), p("/tmp/gs/cdi")).unwrap();
    // Beside claims/ is fine; in it is not.
    check_layout(p("/tmp/gs"), p("/tmp/gs/state"), p("/tmp/gs/claimsx")).unwrap();
    let e = check_layout(p("/tmp/gs"), p("/tmp/x"), p("/tmp/x"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("the CDI directory /tmp/x is also the state directory: container runtimes"),
        "{e}"
    );
    let e = check_layout(p("/tmp/x"), p("/tmp/s"), p("/tmp/x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is also the run directory"), "{e}");
    let e = check_layout(p("/tmp/gs"), p("/tmp/gs/claims/s"), p("/tmp/c"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the state directory /tmp/gs/claims/s lies in /tmp/gs/claims"),
        "{e}"
    );
    let e = check_layout(p("/tmp/gs"), p("/tmp/s"), p("/tmp/gs/claims"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the CDI directory /tmp/gs/claims lies in"),
        "{e}"
    );
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("none.toml");
    assert_eq!(
        DaemonConfig::load(&p, false).unwrap(),
        DaemonConfig::default()
    );
    assert!(matches!(
        DaemonConfig::load(&p, true),
        Err(DaemonConfigError::Read { .. })
    ));
}
