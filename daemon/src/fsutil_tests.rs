//! Unit tests of `fsutil.rs`.

use super::*;

#[test]
fn write_atomic_replaces_and_sets_mode() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.json");
    write_atomic(&p, b"one", 0o644).unwrap();
    write_atomic(&p, b"two", 0o600).unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"two");
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
}

#[test]
fn create_dir_refuses_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    fs::write(&p, b"").unwrap();
    assert!(create_dir(&p, 0o755).is_err());
    let d = dir.path().join("x/y");
    create_dir(&d, 0o711).unwrap();
    assert_eq!(
        fs::metadata(&d).unwrap().permissions().mode() & 0o777,
        0o711
    );
}

use std::os::unix::fs::{lchown, symlink};

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn create_dir_never_follows_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::set_permissions(&outside, Permissions::from_mode(0o755)).unwrap();
    let link = dir.path().join("claims");
    symlink(&outside, &link).unwrap();
    let e = create_dir(&link, 0o700).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
    assert_eq!(
        mode_of(&outside),
        0o755,
        "the link's target was not chmodded"
    );
    // A link planted by another uid is not followed on the way down either.
    lchown(&link, Some(65534), Some(65534)).unwrap();
    let e = create_dir(&link.join("uid/mps"), 0o700).unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing created outside"
    );
}

#[test]
fn create_dir_refuses_a_foreign_directory_and_sets_parent_modes() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    lchown(&foreign, Some(65534), None).unwrap();
    let e = create_dir(&foreign, 0o700).unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    let deep = dir.path().join("a/b/c");
    create_dir(&deep, 0o750).unwrap();
    assert_eq!(mode_of(&deep), 0o750);
    assert_eq!(mode_of(&dir.path().join("a/b")), PARENT_MODE);
}

#[test]
fn write_atomic_replaces_a_planted_link_without_writing_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"keep").unwrap();
    let spec = dir.path().join("spec.json");
    symlink(&victim, &spec).unwrap();
    write_atomic(&spec, b"new", 0o644).unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    // A planted temporary name is removed, never written through.
    let tmp = dir.path().join(".spec.json.tmp-planted");
    symlink(&victim, &tmp).unwrap();
    write_via(&spec, &tmp, b"new", 0o644, true, true).unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    assert!(!fs::symlink_metadata(&spec)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&spec).unwrap(), b"new");
}

#[test]
fn trusted_dirs() {
    let base = tempfile::tempdir().unwrap();
    let good = base.path().join("good");
    fs::create_dir(&good).unwrap();
    fs::set_permissions(&good, Permissions::from_mode(0o755)).unwrap();
    check_trusted_dir(&good).unwrap();
    // A link owned by root on the way (like /var/run -> /run) is fine; the directory
    // itself being a link is not.
    let via = base.path().join("via");
    symlink(base.path(), &via).unwrap();
    check_trusted_dir(&via.join("good")).unwrap();
    let e = check_trusted_dir(&base.path().join("via")).unwrap_err();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
    lchown(&via, Some(65534), None).unwrap();
    let e = check_trusted_dir(&via.join("good")).unwrap_err();
    assert!(
        e.to_string().contains("symbolic link owned by uid 65534"),
        "{e}"
    );
    let foreign = base.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    lchown(&foreign, Some(65534), None).unwrap();
    let e = check_trusted_dir(&foreign).unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    let open = base.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, Permissions::from_mode(0o777)).unwrap();
    let e = check_trusted_dir(&open).unwrap_err();
    assert!(e.to_string().contains("writable by group or others"), "{e}");
    let inner = open.join("inner");
    fs::create_dir(&inner).unwrap();
    let e = check_trusted_dir(&inner).unwrap_err();
    assert!(e.to_string().contains("not sticky"), "{e}");
    assert!(check_trusted_dir(Path::new("relative")).is_err());
    assert!(check_trusted_dir(&good.join("../good")).is_err());
}

#[test]
fn temporary_writers_are_recognised_by_the_name_write_atomic_gives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spec.json");
    // What write_atomic names its temporary: the same shape, this process's pid.
    let n = format!(".spec.json.tmp-{}-7", std::process::id());
    assert_eq!(
        temporary_writer(&n, "spec.json"),
        Some(std::process::id() as i32)
    );
    assert_eq!(temporary_writer(".spec.json.tmp-12", "spec.json"), None);
    assert_eq!(temporary_writer(".other.json.tmp-12-0", "spec.json"), None);
    assert_eq!(temporary_writer("spec.json", "spec.json"), None);
    write_atomic(&path, b"x", 0o644).unwrap();
    assert!(fs::read_dir(dir.path()).unwrap().count() == 1);
}

#[test]
fn read_own_file_takes_only_a_bounded_regular_file_and_never_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f.json");
    fs::write(&file, b"{}").unwrap();
    assert_eq!(read_own_file(&file, 2).unwrap(), b"{}");
    assert!(matches!(
        read_own_file(&file, 1),
        Err(ReadRefusal::TooLarge(2))
    ));
    assert!(matches!(
        read_own_file(&dir.path().join("none"), 9),
        Err(ReadRefusal::Missing)
    ));
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(matches!(
        read_own_file(&link, 9),
        Err(ReadRefusal::NotAFile("a symbolic link"))
    ));
    assert!(matches!(
        read_own_file(dir.path(), 9),
        Err(ReadRefusal::NotAFile("a directory"))
    ));
    // A fifo with no writer: opening it for reading would block forever.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let refusal = read_own_file(&fifo, 9).unwrap_err();
    assert!(refusal.to_string().contains("a fifo"), "{refusal}");
}

#[test]
fn read_listed_file_refuses_what_was_swapped_in_after_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.json");
    fs::write(&file, b"{\"a\":1}").unwrap();
    assert_eq!(read_listed_file(&file, 7).unwrap(), b"{\"a\":1}");
    assert!(matches!(
        read_listed_file(&file, 6),
        Err(ReadRefusal::TooLarge(7))
    ));
    // Listed as a file, then replaced: by a fifo with no writer (opened without blocking,
    // refused on the handle), by a link, by nothing.
    fs::remove_file(&file).unwrap();
    nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let refusal = read_listed_file(&file, 9).unwrap_err();
    assert!(refusal.to_string().contains("a fifo"), "{refusal}");
    fs::remove_file(&file).unwrap();
    let target = dir.path().join("target.json");
    fs::write(&target, b"{}").unwrap();
    std::os::unix::fs::symlink(&target, &file).unwrap();
    assert!(matches!(
        read_listed_file(&file, 9),
        Err(ReadRefusal::NotAFile("a symbolic link"))
    ));
    fs::remove_file(&file).unwrap();
    assert!(matches!(
        read_listed_file(&file, 9),
        Err(ReadRefusal::Missing)
    ));
    // A file that reports no size is read to its end, still bounded.
    let status = Path::new("/proc/self/status");
    let text = read_listed_file(status, 1 << 20).unwrap();
    assert!(String::from_utf8_lossy(&text).contains("Pid:"));
    assert!(matches!(
        read_listed_file(status, 16),
        Err(ReadRefusal::TooLarge(17))
    ));
}

#[test]
fn ensure_dir_makes_fixes_and_refuses_as_create_dir_does() {
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    // Missing: made with the mode.
    let d = dir.path().join("claim");
    ensure_dir(&d, 0o711).unwrap();
    assert_eq!(mode(&d), 0o711);
    // Already right: left as it is.
    ensure_dir(&d, 0o711).unwrap();
    assert_eq!(mode(&d), 0o711);
    // Another mode: set through the checked path.
    fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
    ensure_dir(&d, 0o711).unwrap();
    assert_eq!(mode(&d), 0o711);
    // A link where the directory should be is refused, even to a directory that is right.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&d, &link).unwrap();
    assert!(ensure_dir(&link, 0o711).is_err());
    // So is a file.
    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    assert!(ensure_dir(&file, 0o711).is_err());
}
