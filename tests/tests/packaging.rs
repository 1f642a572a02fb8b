//! The RPM and the shipped binaries: what `packaging/build-rpm.sh` built (scripts/test.sh runs
//! it with `--profile dev` before the tests), checked with the real `rpm`, `systemd-analyze`
//! and `objdump`, and installed into a throwaway root with its scriptlets running.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_e2e::{bin, need, which};

/// The binaries the RPM ships.
const SHIPPED: [&str; 5] = [
    "gpushared",
    "gpushare",
    "gpushare-cdi-hook",
    "gpushare-runtime",
    "gpushare-dra",
];

/// AL2023's glibc.
const AL2023_GLIBC: (u32, u32) = (2, 34);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

/// The RPM built from this build, or `None` (skip, or fail under GPUSHARE_E2E_REQUIRE=1).
fn built_rpm() -> Option<PathBuf> {
    if !need(which("rpm").is_some(), "rpm (Debian package rpm)") {
        return None;
    }
    let rpm = gpushare_e2e::release::built_rpm();
    need(
        rpm.is_some(),
        "an RPM of this build in target/generate-rpm (run packaging/build-rpm.sh --profile dev)",
    );
    rpm
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file the package must hold, with its mode and whether it is %config(noreplace).
fn expected_files() -> Vec<(&'static str, u32, bool)> {
    let mut v = vec![
        ("/usr/bin/gpushared", 0o755, false),
        ("/usr/bin/gpushare", 0o755, false),
        ("/usr/bin/gpushare-cdi-hook", 0o755, false),
        ("/usr/bin/gpushare-runtime", 0o755, false),
        ("/usr/lib/systemd/system/gpushared.service", 0o644, false),
        ("/usr/bin/gpushare-dra", 0o755, false),
        ("/usr/lib/systemd/system/gpushare-dra.service", 0o644, false),
        ("/etc/gpushare/dra.toml", 0o644, true),
        ("/etc/gpushare/gpushare-dra.env", 0o644, true),
        (
            "/usr/lib/systemd/system-preset/90-gpushare.preset",
            0o644,
            false,
        ),
        ("/usr/lib/tmpfiles.d/gpushare.conf", 0o644, false),
        ("/etc/gpushare/config.toml", 0o644, true),
        ("/etc/gpushare/gpushared.env", 0o644, true),
        ("/etc/gpushare/runtime.toml", 0o644, true),
        (
            "/usr/share/doc/gpushare/examples/containerd-gpushare-runtime.toml",
            0o644,
            false,
        ),
        ("/etc/eks/nodeadm.d/50-gpushare.yaml", 0o644, true),
        ("/usr/share/man/man8/gpushared.8.gz", 0o644, false),
        ("/usr/share/man/man8/gpushare-cdi-hook.8.gz", 0o644, false),
        ("/usr/share/man/man8/gpushare-runtime.8.gz", 0o644, false),
        ("/usr/share/man/man8/gpushare-dra.8.gz", 0o644, false),
        ("/usr/share/man/man8/gpushare-dra-probe.8.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare.1.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare-doctor.1.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare-prepare.1.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare-mig.1.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare-mig-plan.1.gz", 0o644, false),
        ("/usr/share/man/man1/gpushare-mig-apply.1.gz", 0o644, false),
        (
            "/usr/share/bash-completion/completions/gpushare",
            0o644,
            false,
        ),
        ("/usr/share/zsh/site-functions/_gpushare", 0o644, false),
        (
            "/usr/share/fish/vendor_completions.d/gpushare.fish",
            0o644,
            false,
        ),
        (
            "/usr/share/bash-completion/completions/gpushare-dra",
            0o644,
            false,
        ),
        ("/usr/share/zsh/site-functions/_gpushare-dra", 0o644, false),
        (
            "/usr/share/fish/vendor_completions.d/gpushare-dra.fish",
            0o644,
            false,
        ),
        ("/usr/share/licenses/gpushare/LICENSE", 0o644, false),
        ("/usr/share/doc/gpushare/README.md", 0o644, false),
        // The README's and docs/'s examples, at the same path relative to them.
        (
            "/usr/share/doc/gpushare/docs/examples/mig-layout.yaml",
            0o644,
            false,
        ),
        (
            "/usr/share/doc/gpushare/docs/examples/guide-mig-3g20gb.yaml",
            0o644,
            false,
        ),
        (
            "/usr/share/doc/gpushare/docs/examples/node-profile-mig.toml",
            0o644,
            false,
        ),
        (
            "/usr/share/doc/gpushare/deployments/deviceclasses.yaml",
            0o644,
            false,
        ),
        (
            "/usr/share/doc/gpushare/deployments/examples/mps-shared-claim.yaml",
            0o644,
            false,
        ),
    ];
    v.sort();
    v
}

#[test]
fn rpm_lists_every_file_with_modes_and_config_flags() {
    let Some(rpm) = built_rpm() else { return };
    let listed = run(Command::new("rpm").arg("-qlp").arg(&rpm));
    let listed: Vec<&str> = listed.lines().collect();
    // FILEFLAGS: "c" config, "n" noreplace; FILEMODES as octal.
    let flags = run(Command::new("rpm")
        .arg("-qp")
        .arg("--qf")
        .arg("[%{FILENAMES}\t%{FILEFLAGS:fflags}\t%{FILEMODES:octal}\t%{FILEUSERNAME}\n]")
        .arg(&rpm));
    let by_name: BTreeMap<&str, (&str, &str, &str)> = flags
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?, (f.next()?, f.next()?, f.next()?)))
        })
        .collect();
    for (path, mode, config) in expected_files() {
        assert!(
            listed.contains(&path),
            "{path} is not in the RPM: {listed:?}"
        );
        let (fflags, fmode, user) = by_name[path];
        assert!(
            fmode.ends_with(&format!("{mode:o}")),
            "{path}: mode {fmode}, want {mode:o}"
        );
        assert_eq!(user, "root", "{path}");
        assert_eq!(
            fflags.contains('c') && fflags.contains('n'),
            config,
            "{path}: flags {fflags:?} (config noreplace expected: {config})"
        );
    }
    // Every example of docs/examples/, which the README and docs/ name by relative path.
    for e in fs::read_dir(workspace().join("docs/examples")).expect("docs/examples") {
        let name = e.expect("entry").file_name();
        let path = format!(
            "/usr/share/doc/gpushare/docs/examples/{}",
            name.to_string_lossy()
        );
        assert!(listed.contains(&path.as_str()), "{path} is not in the RPM");
    }
    // One man page per visible subcommand of the CLI, generated from its clap definition.
    let help = run(Command::new(bin("gpushare")).arg("--help"));
    let commands = help
        .split("Commands:")
        .nth(1)
        .expect("a Commands: section")
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help");
    for c in commands {
        let page = format!("/usr/share/man/man1/gpushare-{c}.1.gz");
        assert!(listed.contains(&page.as_str()), "{page} missing");
    }
    let arch = run(Command::new("rpm")
        .args(["-qp", "--qf", "%{ARCH}"])
        .arg(&rpm));
    assert_eq!(arch, std::env::consts::ARCH);
}

#[test]
fn rpm_scriptlets_match_the_systemd_macros() {
    let Some(rpm) = built_rpm() else { return };
    let scripts = run(Command::new("rpm").args(["-qp", "--scripts"]).arg(&rpm));
    for (section, call) in [
        (
            "postinstall scriptlet",
            "systemctl --no-reload preset gpushared.service",
        ),
        (
            "preuninstall scriptlet",
            "systemctl --no-reload disable --now gpushared.service",
        ),
        (
            "postuninstall scriptlet",
            "systemctl try-restart gpushared.service",
        ),
    ] {
        let body = scripts
            .split(section)
            .nth(1)
            .unwrap_or_else(|| panic!("no {section} in:\n{scripts}"));
        let body = body.split(" scriptlet").next().unwrap_or(body);
        assert!(body.contains(call), "{section} lacks {call:?}:\n{body}");
    }

    // What each scriptlet does for each `$1`, with systemd "running" and systemctl recorded.
    let dir = tempfile::tempdir().expect("tempdir");
    let fake_bin = dir.path().join("bin");
    fs::create_dir(&fake_bin).expect("mkdir");
    let log = dir.path().join("calls");
    for tool in ["systemctl", "systemd-tmpfiles"] {
        let p = fake_bin.join(tool);
        fs::write(
            &p,
            format!("#!/bin/sh\necho \"{tool} $*\" >>{}\n", log.display()),
        )
        .expect("fake tool");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let script = |name: &str| workspace().join("packaging/rpm").join(name);
    let calls = |name: &str, arg: &str| -> String {
        let _ = fs::remove_file(&log);
        run(Command::new("sh")
            .arg(script(name))
            .arg(arg)
            .env("PATH", format!("{}:/usr/bin:/bin", fake_bin.display())));
        fs::read_to_string(&log).unwrap_or_default()
    };
    let booted = Path::new("/run/systemd/system").is_dir();
    let fresh = calls("post_install.sh", "1");
    assert!(
        fresh.contains("systemctl --no-reload preset gpushared.service"),
        "{fresh}"
    );
    assert!(fresh.contains("systemd-tmpfiles --create"), "{fresh}");
    let upgrade = calls("post_install.sh", "2");
    assert!(
        !upgrade.contains("preset"),
        "an upgrade must not re-apply presets: {upgrade}"
    );
    assert!(
        fresh.contains("systemctl --no-reload preset gpushare-dra.service"),
        "{fresh}"
    );
    let erase = calls("pre_uninstall.sh", "0");
    assert!(erase.contains("disable --now gpushared.service"), "{erase}");
    // The plugin stops first, then this node's slices go (`gpushare-dra --remove-slices`).
    let plugin_stop = erase
        .find("disable --now gpushare-dra.service")
        .unwrap_or_else(|| panic!("{erase}"));
    assert!(plugin_stop < erase.find("disable --now gpushared.service").unwrap_or(0));
    let text = fs::read_to_string(script("pre_uninstall.sh")).expect("scriptlet");
    assert!(
        text.contains("/usr/bin/gpushare-dra $GPUSHARE_DRA_ARGS --remove-slices"),
        "{text}"
    );
    assert_eq!(
        calls("pre_uninstall.sh", "1"),
        "",
        "an upgrade must not stop the service"
    );
    let after_upgrade = calls("post_uninstall.sh", "1");
    assert!(
        after_upgrade.contains("try-restart gpushared.service"),
        "{after_upgrade}"
    );
    let after_erase = calls("post_uninstall.sh", "0");
    assert!(!after_erase.contains("try-restart"), "{after_erase}");
    assert_eq!(
        after_erase.contains("daemon-reload"),
        booted,
        "{after_erase}"
    );
}

/// A root to install into: rpm's database, `/dev/null`, and busybox as `/bin/sh` so that the
/// scriptlets run (chrooted) as they would on a node being baked.
fn install_root() -> tempfile::TempDir {
    let root = tempfile::Builder::new()
        .prefix("gs-rpmroot-")
        .tempdir()
        .expect("tempdir");
    let r = root.path();
    fs::create_dir_all(r.join("bin")).expect("bin");
    fs::create_dir_all(r.join("dev")).expect("dev");
    fs::copy("/bin/busybox", r.join("bin/sh")).expect("busybox as /bin/sh");
    fs::copy("/bin/busybox", r.join("bin/kill")).expect("busybox as /bin/kill");
    nix::sys::stat::mknod(
        &r.join("dev/null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod /dev/null");
    run(Command::new("rpm").arg("--root").arg(r).arg("--initdb"));
    root
}

#[test]
fn rpm_installs_upgrades_and_erases_in_a_root_and_units_verify() {
    let Some(rpm) = built_rpm() else { return };
    if !need(gpushare_e2e::is_root(), "root (rpm --root chroots)")
        || !need(Path::new("/bin/busybox").is_file(), "busybox-static")
        || !need(which("systemd-analyze").is_some(), "systemd-analyze")
    {
        return;
    }
    let root = install_root();
    let r = root.path();
    let rpm_cmd = || {
        let mut c = Command::new("rpm");
        c.arg("--root").arg(r);
        c
    };
    run(rpm_cmd().args(["-i", "--nodeps"]).arg(&rpm));
    for (path, mode, _) in expected_files() {
        let meta = fs::metadata(r.join(path.trim_start_matches('/')))
            .unwrap_or_else(|e| panic!("{path} not installed: {e}"));
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path}");
    }
    // The preset, as systemd applies it to the installed tree: gpushared enabled; the
    // plugin's unit installed but disabled (the plugin runs as the DaemonSet, and both
    // would be two plugins for one driver on the node).
    if need(which("systemctl").is_some(), "systemctl") {
        let systemctl = || {
            let mut c = Command::new("systemctl");
            c.arg(format!("--root={}", r.display()));
            c
        };
        run(systemctl().args(["preset", "gpushared.service", "gpushare-dra.service"]));
        for (unit, want) in [
            ("gpushared.service", "enabled"),
            ("gpushare-dra.service", "disabled"),
        ] {
            let out = systemctl()
                .args(["is-enabled", unit])
                .output()
                .expect("systemctl is-enabled");
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{unit}");
        }
    }
    // tmpfiles.d creates the directories with the modes the daemon expects.
    run(Command::new("systemd-tmpfiles")
        .arg(format!("--root={}", r.display()))
        .args(["--create", "gpushare.conf"]));
    for (dir, mode) in [
        ("run/gpushare", 0o755),
        ("run/cdi", 0o755),
        ("etc/cdi", 0o755),
        ("var/lib/gpushare", 0o700),
    ] {
        let meta = fs::metadata(r.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert!(meta.is_dir(), "{dir}");
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{dir}");
    }
    // The completion script is valid bash and completes the CLI's subcommands.
    let completion = r.join("usr/share/bash-completion/completions/gpushare");
    run(Command::new("bash").arg("-n").arg(&completion));
    let text = fs::read_to_string(&completion).expect("completion");
    assert!(
        text.contains("doctor") && text.contains("unprepare"),
        "{text}"
    );
    // The installed config is the documented default gpushared prints.
    let installed = fs::read_to_string(r.join("etc/gpushare/config.toml")).expect("config");
    let printed = run(Command::new(bin("gpushared")).arg("--print-default-config"));
    assert_eq!(installed, printed);

    // systemd-analyze verify against the installed tree (targets copied from the host): no
    // complaint at all, since it exits 0 even for unknown keys and bad values.
    let units = r.join("usr/lib/systemd/system");
    for entry in fs::read_dir("/usr/lib/systemd/system").expect("host units") {
        let p = entry.expect("entry").path();
        if p.extension().is_some_and(|e| e == "target") {
            let _ = fs::copy(&p, units.join(p.file_name().expect("name")));
        }
    }
    let verify = |unit: &str| {
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", r.display()))
            .arg(unit)
            .output()
            .expect("systemd-analyze")
    };
    for unit in ["gpushared.service", "gpushare-dra.service"] {
        let out = verify(unit);
        let said = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{unit}: {said}"
        );
    }
    // The plugin's unit: ordered after gpushared and kubelet, always restarted in 2 s (under
    // kubelet's 30 s wipe), no capabilities kept, flags from its env file.
    let dra_unit = fs::read_to_string(units.join("gpushare-dra.service")).expect("unit");
    for line in [
        "After=network-online.target gpushared.service kubelet.service",
        "Restart=always",
        "RestartSec=2",
        "CapabilityBoundingSet=\n",
        "AmbientCapabilities=\n",
        "EnvironmentFile=-/etc/gpushare/gpushare-dra.env",
        "ExecStart=/usr/bin/gpushare-dra $GPUSHARE_DRA_ARGS",
    ] {
        assert!(
            dra_unit.contains(line),
            "{line:?} not in gpushare-dra.service"
        );
    }
    let installed_dra = fs::read_to_string(r.join("etc/gpushare/dra.toml")).expect("dra.toml");
    let printed_dra = run(Command::new(bin("gpushare-dra")).arg("--print-default-config"));
    assert_eq!(installed_dra, printed_dra);
    // …and it does complain about a broken copy, so the check above can fail.
    let unit = units.join("gpushared.service");
    let good = fs::read_to_string(&unit).expect("unit");
    fs::write(&unit, good.replace("KillMode=process", "KillMode=proces")).expect("write");
    let out = verify("gpushared.service");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kill mode"),
        "{out:?}"
    );
    fs::write(&unit, &good).expect("restore");

    // Upgrade in place keeps an edited %config(noreplace) file.
    let config = r.join("etc/gpushare/config.toml");
    let edited = installed.replace("level = \"info\"", "level = \"debug\"");
    fs::write(&config, &edited).expect("edit config");
    run(rpm_cmd()
        .args(["-U", "--replacepkgs", "--nodeps"])
        .arg(&rpm));
    assert_eq!(fs::read_to_string(&config).expect("config"), edited);

    // Erase removes every file; the edited config is kept as .rpmsave.
    run(rpm_cmd().args(["-e", "--nodeps", "gpushare"]));
    for (path, _, _) in expected_files() {
        assert!(
            !r.join(path.trim_start_matches('/')).exists(),
            "{path} left after erase"
        );
    }
    assert_eq!(
        fs::read_to_string(r.join("etc/gpushare/config.toml.rpmsave")).expect("rpmsave"),
        edited
    );
}

#[test]
fn every_man_page_names_its_command_once() {
    // What build-rpm.sh runs, each page's NAME line read: "<page> - <what it does>", never
    // "gpushared - gpushared: …".
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for (binary, args) in [
        ("gpushare", &["generate-man"][..]),
        ("gpushared", &["--generate-man"][..]),
        ("gpushare-dra", &["--generate-man"][..]),
        ("gpushare-cdi-hook", &["--generate-man"][..]),
        ("gpushare-runtime", &["--generate-man"][..]),
    ] {
        run(Command::new(bin(binary)).args(args).arg(d));
    }
    let mut seen = Vec::new();
    for e in fs::read_dir(d).expect("pages") {
        let path = e.expect("entry").path();
        let page = fs::read_to_string(&path).expect("page");
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let line = page
            .split(".SH NAME\n")
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .unwrap_or_else(|| panic!("{file}: no NAME section"))
            .replace("\\-", "-");
        let (name, what) = line
            .split_once(" - ")
            .unwrap_or_else(|| panic!("{file}: {line}"));
        assert!(file.starts_with(&format!("{name}.")), "{file}: {line}");
        let first = what.split([':', ' ']).next().unwrap_or_default();
        assert!(
            !first.eq_ignore_ascii_case(name) && !what.trim().is_empty(),
            "{file}: NAME repeats the name: {line}"
        );
        seen.push(file);
    }
    seen.sort();
    for page in [
        "gpushared.8",
        "gpushare.1",
        "gpushare-mig-plan.1",
        "gpushare-dra.8",
    ] {
        assert!(seen.iter().any(|f| f == page), "{page} not among {seen:?}");
    }
}

/// `(major, minor)` of every `GLIBC_x.y` symbol version `objdump -T` shows for `path`.
fn glibc_versions(path: &Path) -> Vec<(u32, u32)> {
    let out = run(Command::new("objdump").arg("-T").arg(path));
    let mut v: Vec<(u32, u32)> = out
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let ver: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = ver.split('.');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn no_shipped_binary_needs_a_glibc_newer_than_al2023s() {
    if !need(which("objdump").is_some(), "objdump (binutils)") {
        return;
    }
    for name in SHIPPED {
        let elf = run(Command::new("readelf").arg("-l").arg(bin(name)));
        if !elf.contains("Requesting program interpreter") {
            // Linked static (scripts/link-static.sh, the hook and the runtime wrapper in a
            // release build): it carries its own glibc and needs none on the node.
            continue;
        }
        let versions = glibc_versions(&bin(name));
        assert!(
            !versions.is_empty(),
            "{name}: no GLIBC symbol versions found"
        );
        let newest = versions.last().copied().expect("non-empty");
        assert!(
            newest <= AL2023_GLIBC,
            "{name} needs GLIBC_{}.{} (AL2023 has {}.{}): {versions:?}",
            newest.0,
            newest.1,
            AL2023_GLIBC.0,
            AL2023_GLIBC.1
        );
    }
    // The RPM's own dependencies say the same to the node's package manager.
    if let Some(rpm) = built_rpm() {
        let requires = run(Command::new("rpm").args(["-qp", "--requires"]).arg(&rpm));
        for line in requires.lines().filter(|l| l.contains("(GLIBC_")) {
            let ver = line
                .split("(GLIBC_")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .expect("version");
            let mut p = ver.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
            let v = (p.next().unwrap_or(0), p.next().unwrap_or(0));
            assert!(v <= AL2023_GLIBC, "RPM requires {line}");
        }
    }
}
