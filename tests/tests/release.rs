//! The release command (`packaging/release.sh`) with a throwaway key, as CI makes one: the RPM
//! signed so that `rpm -K` passes with the key's public half and fails on a tampered copy or
//! without the key, signed checksums over every artifact, the plugin's image archive and the
//! packaged chart; and bad input refused with nothing written.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpushare_e2e::release::{self, built_rpm, gpg, release_command, stop_agent, throwaway_key};
use gpushare_e2e::{need, which};

/// The RPM of this build and the node components' helm, or `None` (skip, or fail under
/// GPUSHARE_E2E_REQUIRE=1).
fn inputs() -> Option<(PathBuf, PathBuf)> {
    for tool in ["rpm", "rpmsign", "gpg", "podman", "rpm2archive"] {
        if !need(which(tool).is_some(), tool) {
            return None;
        }
    }
    let rpm = built_rpm();
    if !need(
        rpm.is_some(),
        "an RPM of this build (packaging/build-rpm.sh --profile dev)",
    ) {
        return None;
    }
    Some((rpm.unwrap(), release::helm()?))
}

/// `rpm --dbpath DB -K FILE`.
fn rpm_k(db: &Path, file: &Path) -> Output {
    Command::new("rpm")
        .arg("--dbpath")
        .arg(db)
        .arg("-K")
        .arg(file)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_release_is_signed_checked_by_rpm_k_and_a_tampered_copy_fails() {
    let Some((rpm, helm)) = inputs() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let rel = release::make(&rpm, &helm, tmp.path());
    let version = env!("CARGO_PKG_VERSION");
    let mut names: Vec<String> = fs::read_dir(&rel.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let signed = rel.artifact("gpushare-0", ".rpm");
    assert_eq!(
        names,
        [
            "RPM-GPG-KEY-gpushare".to_string(),
            "SHA256SUMS".into(),
            "SHA256SUMS.asc".into(),
            signed.file_name().unwrap().to_string_lossy().into_owned(),
            format!("gpushare-dra-{version}.oci.tar"),
            format!("gpushare-dra-{version}.tgz"),
        ]
    );

    // Without the key rpm refuses the signature; with it the RPM passes; a copy with one
    // payload byte changed fails.
    let db = tmp.path().join("rpmdb");
    fs::create_dir(&db).unwrap();
    let nokey = rpm_k(&db, &signed);
    assert!(!nokey.status.success(), "{}", text(&nokey));
    let st = Command::new("rpm")
        .arg("--dbpath")
        .arg(&db)
        .arg("--import")
        .arg(rel.dir.join("RPM-GPG-KEY-gpushare"))
        .status()
        .unwrap();
    assert!(st.success());
    let ok = rpm_k(&db, &signed);
    assert!(
        ok.status.success() && text(&ok).contains("digests signatures OK"),
        "{}",
        text(&ok)
    );
    let tampered = tmp.path().join("tampered.rpm");
    let mut bytes = fs::read(&signed).unwrap();
    let at = bytes.len() - 4096;
    bytes[at] ^= 0xff;
    fs::write(&tampered, &bytes).unwrap();
    let bad = rpm_k(&db, &tampered);
    assert!(!bad.status.success(), "{}", text(&bad));
    assert!(text(&bad).contains("NOT OK"), "{}", text(&bad));
    // The unsigned input RPM is not what was shipped.
    let unsigned = rpm_k(&db, &rpm);
    assert!(
        !text(&unsigned).contains("signatures OK"),
        "{}",
        text(&unsigned)
    );

    // The key's fingerprint is the one the script printed (what a user compares with the
    // publisher's).
    let shown = gpg(&rel.gnupghome)
        .args(["--with-colons", "--show-keys"])
        .arg(rel.dir.join("RPM-GPG-KEY-gpushare"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains(&format!("fpr:::::::::{}:", rel.fingerprint)),
        "{}",
        text(&shown)
    );

    // Every artifact is in the checksums, they match, and their signature verifies.
    let sums = fs::read_to_string(rel.dir.join("SHA256SUMS")).unwrap();
    assert_eq!(sums.lines().count(), 4, "{sums}");
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&rel.dir)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));
    let verify = gpg(&rel.gnupghome)
        .arg("--verify")
        .arg(rel.dir.join("SHA256SUMS.asc"))
        .arg(rel.dir.join("SHA256SUMS"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", text(&verify));
    let forged = tmp.path().join("SHA256SUMS");
    fs::write(&forged, sums.replacen(&sums[..8], "00000000", 1)).unwrap();
    let verify = gpg(&rel.gnupghome)
        .arg("--verify")
        .arg(rel.dir.join("SHA256SUMS.asc"))
        .arg(&forged)
        .output()
        .unwrap();
    assert!(!verify.status.success(), "{}", text(&verify));
    stop_agent(&rel.gnupghome);

    // The image archive names the image the chart's defaults use, and holds the plugin.
    let listing = Command::new("tar")
        .arg("-xOf")
        .arg(rel.dir.join(format!("gpushare-dra-{version}.oci.tar")))
        .arg("index.json")
        .output()
        .unwrap();
    let index = String::from_utf8_lossy(&listing.stdout);
    assert!(
        index.contains(&format!("localhost/gpushare-dra:{version}")),
        "{index}"
    );
    // The chart is the repository's, at the workspace's version.
    let chart = Command::new(&helm)
        .args(["show", "chart"])
        .arg(rel.dir.join(format!("gpushare-dra-{version}.tgz")))
        .output()
        .unwrap();
    let chart = String::from_utf8_lossy(&chart.stdout);
    assert!(chart.contains(&format!("version: {version}")), "{chart}");
    assert!(chart.contains(&format!("appVersion: {version}")), "{chart}");
}

#[test]
fn bad_input_to_the_release_command_is_refused_and_writes_nothing() {
    let Some((rpm, helm)) = inputs() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("gnupg");
    let key = throwaway_key(&home);
    let rpm_arg = rpm.to_str().unwrap();

    // A key the keyring lacks: refused before anything is built, DIR not made.
    let out_dir = tmp.path().join("dist");
    let out = release_command(
        &home,
        &helm,
        &[
            "--key",
            "nobody@gpushare.invalid",
            "--rpm",
            rpm_arg,
            "--out",
        ],
    )
    .arg(&out_dir)
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no secret key 'nobody@gpushare.invalid'"),
        "{}",
        text(&out)
    );
    assert!(!out_dir.exists());

    // No key at all: the usage error.
    let out = release_command(&home, &helm, &["--rpm", rpm_arg])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--key KEY is required"),
        "{}",
        text(&out)
    );

    // An output directory holding files already: refused, its files untouched.
    fs::create_dir(&out_dir).unwrap();
    fs::write(out_dir.join("SHA256SUMS"), "an earlier release's\n").unwrap();
    let out = release_command(&home, &helm, &["--key", key, "--rpm", rpm_arg, "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("holds files already"), "{}", text(&out));
    assert_eq!(fs::read_dir(&out_dir).unwrap().count(), 1);
    assert_eq!(
        fs::read_to_string(out_dir.join("SHA256SUMS")).unwrap(),
        "an earlier release's\n"
    );

    // An RPM that is not this version's gpushare: refused, nothing written.
    let other = tmp.path().join("other-1.0-1.x86_64.rpm");
    fs::copy(&rpm, &other).unwrap();
    let fresh = tmp.path().join("dist2");
    let out = release_command(&home, &helm, &["--key", key, "--out"])
        .arg(&fresh)
        .arg("--rpm")
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("is not gpushare"), "{}", text(&out));
    assert!(!fresh.exists());

    // A step failing half-way (here the chart's packaging): no DIR, and nothing of the work
    // left beside it.
    let out = release_command(&home, Path::new("/bin/false"), &["--key", key, "--out"])
        .arg(&fresh)
        .args(["--rpm", rpm_arg])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!fresh.exists());
    let mut beside: Vec<String> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    beside.sort();
    assert_eq!(beside, ["dist", "gnupg", "other-1.0-1.x86_64.rpm"]);
    // A relative --out is where the command was run from, not the repository.
    let out = release_command(
        &home,
        &helm,
        &["--key", key, "--out", "rel-dist", "--rpm", rpm_arg],
    )
    .current_dir(tmp.path())
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(tmp.path().join("rel-dist/SHA256SUMS").is_file());
    assert!(!gpushare_e2e::cluster::repo().join("rel-dist").exists());
    stop_agent(&home);
}
