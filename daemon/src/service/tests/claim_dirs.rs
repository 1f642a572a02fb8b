//! A claim's directory under `<run-dir>/claims` is `0711` whatever its strategy, as
//! docs/node.md says: other host users can neither list the claims' directories nor read what is
//! in them (break-it finding 17: exclusive and time-slicing claims' were `0755`).

use std::os::unix::fs::PermissionsExt;

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn every_claims_directory_is_0711() {
    let f = fixture();
    let ts = json!({"sharingMode": "time-slicing", "timeSlice": "long"});
    f.service.prepare(&claim("e1", &["gpu-0"], None)).unwrap();
    f.service
        .prepare(&claim("t1", &["gpu-1"], Some(ts)))
        .unwrap();
    f.service
        .prepare(&claim("m1", &["gpu-2"], Some(mps(50))))
        .unwrap();
    let claims = f.cfg.run_dir.join("claims");
    assert_eq!(mode(&claims), 0o711, "the claims directory");
    for uid in ["e1", "t1", "m1"] {
        assert_eq!(mode(&claims.join(uid)), 0o711, "{uid}");
        assert_eq!(mode(&claims.join(uid).join("claim.json")), 0o600, "{uid}");
    }
    // A directory an older release made 0755 is put right at the next start.
    let e1 = claims.join("e1");
    std::fs::set_permissions(&e1, std::fs::Permissions::from_mode(0o755)).unwrap();
    let again = restart(&f, fresh_backend());
    assert_eq!(again.get_claim("e1").unwrap().state, ClaimState::Prepared);
    assert_eq!(mode(&e1), 0o711);
}
