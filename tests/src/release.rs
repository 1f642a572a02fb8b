//! The release's artifacts as `packaging/release.sh` makes them (the signed RPM, its public
//! key, the plugin's OCI image archive, the packaged Helm chart, the signed checksums), signed
//! with a throwaway gpg key made for the test: what `tests/tests/release.rs` checks and what
//! the real node installs from (`cluster::Node`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bin_dir;
use crate::cluster::succeeded;

/// One release: its directory and the key that signed it.
#[derive(Debug)]
pub struct Release {
    /// Where `packaging/release.sh` put the artifacts.
    pub dir: PathBuf,
    /// The signing key's fingerprint (40 hex digits), as the script printed it.
    pub fingerprint: String,
    /// The throwaway keyring holding the key (its `GNUPGHOME`; its gpg-agent is stopped).
    pub gnupghome: PathBuf,
}

impl Release {
    /// The artifact of this release whose name starts with `prefix` and ends with `suffix`.
    ///
    /// # Panics
    /// When there is none.
    pub fn artifact(&self, prefix: &str, suffix: &str) -> PathBuf {
        fs::read_dir(&self.dir)
            .expect("release dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with(prefix) && n.ends_with(suffix)
            })
            .unwrap_or_else(|| panic!("no {prefix}*{suffix} in {}", self.dir.display()))
    }
}

/// The helm `scripts/build-cluster.sh` builds with the node's components (built once per pin;
/// cached, this is quick), or `None` (skip, or fail under GPUSHARE_E2E_REQUIRE=1).
pub fn helm() -> Option<PathBuf> {
    let out = Command::new(crate::cluster::repo().join("scripts/build-cluster.sh"))
        .output()
        .expect("scripts/build-cluster.sh");
    let bin = String::from_utf8_lossy(&out.stdout);
    let helm = PathBuf::from(bin.lines().last().unwrap_or_default()).join("helm");
    crate::need(helm.is_file(), "helm (scripts/build-cluster.sh)").then_some(helm)
}

/// The RPM `packaging/build-rpm.sh --profile dev` made of this build (scripts/test.sh runs it),
/// if there is one.
pub fn built_rpm() -> Option<PathBuf> {
    let dir = bin_dir().parent()?.join("generate-rpm");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "rpm")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("gpushare-"))
        })
}

/// A gpg keyring in `dir` (created, mode 0700) holding one new RSA signing key without a
/// passphrase, as CI makes a throwaway one; the key's e-mail.
///
/// # Panics
/// When gpg fails.
pub fn throwaway_key(dir: &Path) -> &'static str {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir).expect("gnupg home");
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).expect("chmod gnupg home");
    let email = "release-test@gpushare.invalid";
    let out = gpg(dir)
        .args(["--pinentry-mode", "loopback", "--passphrase", ""])
        .arg("--quiet")
        .args([
            "--quick-gen-key",
            &format!("gpushare release test <{email}>"),
        ])
        .args(["rsa3072", "sign", "never"])
        .output()
        .expect("gpg");
    succeeded("gpg --quick-gen-key", out);
    email
}

/// `gpg --batch` on the keyring `home`, not run yet.
pub fn gpg(home: &Path) -> Command {
    let mut cmd = Command::new("gpg");
    cmd.env("GNUPGHOME", home).arg("--batch");
    cmd
}

/// `packaging/release.sh ARGS` with the keyring `home` and `helm` (its directory first on
/// PATH), not run yet.
pub fn release_command(home: &Path, helm: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(crate::cluster::repo().join("packaging/release.sh"));
    cmd.env("GNUPGHOME", home).env("HELM", helm).args(args);
    cmd
}

/// Stops the gpg-agent gpg started for the keyring `home` (it outlives gpg otherwise).
pub fn stop_agent(home: &Path) {
    let _ = Command::new("gpgconf")
        .env("GNUPGHOME", home)
        .args(["--kill", "all"])
        .output();
}

/// Makes a release of `rpm` with a throwaway key, with `helm`, in `base` (`base/gnupg` the
/// keyring, `base/dist` the artifacts; `base` emptied first).
///
/// # Panics
/// When the key cannot be made or the release command fails.
pub fn make(rpm: &Path, helm: &Path, base: &Path) -> Release {
    let _ = fs::remove_dir_all(base);
    fs::create_dir_all(base).expect("release base dir");
    let home = base.join("gnupg");
    let key = throwaway_key(&home);
    let dir = base.join("dist");
    let rpm = rpm.to_str().expect("utf-8 path");
    let out = release_command(&home, helm, &["--key", key, "--out"])
        .arg(&dir)
        .args(["--rpm", rpm])
        .output()
        .expect("packaging/release.sh");
    stop_agent(&home);
    let stdout = succeeded("packaging/release.sh", out);
    let fingerprint = stdout.lines().last().unwrap_or_default().to_string();
    assert_eq!(fingerprint.len(), 40, "no fingerprint in:\n{stdout}");
    Release {
        dir,
        fingerprint,
        gnupghome: home,
    }
}
