//! The measurement behind the store choice (`docs/crash-safety.md`, "Why per-claim files"):
//! per change and at start, one file per claim record (temporary file, fsync, rename, directory
//! fsync) against one redb commit, at 10 and 1,000 records of 1.3 KiB, and the whole-node
//! rewrite the previous checkpoint did. `cargo run --release -p gpushare-bench --bin
//! store-choice [DIR]` (DIR on the disk to measure; default /tmp/storebench).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// The one table of the redb variant: claim key to record bytes.
const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");

/// Changes measured per store and size.
const CHANGES: usize = 200;

/// Whole-checkpoint rewrites measured.
const REWRITES: usize = 50;

/// A claim record of about 1.3 KiB, the size of a real one with one MPS group.
fn record(i: usize) -> Vec<u8> {
    let mut v = format!("{{\"uid\":\"{i:08}-0000-4000-8000-000000000000\",\"x\":\"").into_bytes();
    v.extend(std::iter::repeat_n(b'a', 1300));
    v.extend(b"\"}");
    v
}

/// Writes `bytes` as `dir/name` the way the store does: temporary file, fsync, rename,
/// directory fsync.
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// p50 and p99 of `v`, in its unit.
fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn millis_since(s: Instant) -> f64 {
    s.elapsed().as_secs_f64() * 1e3
}

/// One file per record: a change, and reading all back at start.
fn files(base: &Path, n: usize) -> Result<()> {
    let dir = base.join(format!("files-{n}"));
    fs::create_dir_all(&dir)?;
    for i in 0..n {
        write_file(&dir, &format!("{i}.json"), &record(i))?;
    }
    let mut t = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let s = Instant::now();
        write_file(&dir, &format!("{}.json", k % n), &record(k))?;
        t.push(millis_since(s));
    }
    let (p50, p99) = percentiles(t);
    let s = Instant::now();
    let mut total = 0;
    for e in fs::read_dir(&dir)? {
        total += fs::read(e?.path())?.len();
    }
    println!(
        "files n={n}: change p50 {p50:.3} ms p99 {p99:.3} ms; load all {:.3} ms ({total} B)",
        millis_since(s)
    );
    Ok(())
}

/// One redb database: a change is one commit; at start, open and read all.
fn redb(base: &Path, n: usize) -> Result<()> {
    let path = base.join(format!("redb-{n}.redb"));
    let db = Database::create(&path)?;
    let w = db.begin_write()?;
    {
        let mut table = w.open_table(CLAIMS)?;
        for i in 0..n {
            table.insert(i.to_string().as_str(), record(i).as_slice())?;
        }
    }
    w.commit()?;
    let mut t = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let s = Instant::now();
        let w = db.begin_write()?;
        {
            let mut table = w.open_table(CLAIMS)?;
            table.insert((k % n).to_string().as_str(), record(k).as_slice())?;
        }
        w.commit()?;
        t.push(millis_since(s));
    }
    let (p50, p99) = percentiles(t);
    drop(db);
    let s = Instant::now();
    let db = Database::create(&path)?;
    let r = db.begin_read()?;
    let table = r.open_table(CLAIMS)?;
    let mut total = 0;
    for e in table.iter()? {
        total += e?.1.value().len();
    }
    println!(
        "redb  n={n}: change p50 {p50:.3} ms p99 {p99:.3} ms; open+load all {:.3} ms ({total} B), file {} KiB",
        millis_since(s),
        fs::metadata(&path)?.len() / 1024
    );
    Ok(())
}

/// The previous release's whole-node checkpoint rewrite at 1,000 claims, for reference.
fn whole(base: &Path) -> Result<()> {
    let dir = base.join("whole");
    fs::create_dir_all(&dir)?;
    let big: Vec<u8> = (0..1000).flat_map(record).collect();
    let mut t = Vec::with_capacity(REWRITES);
    for _ in 0..REWRITES {
        let s = Instant::now();
        write_file(&dir, "checkpoint.json", &big)?;
        t.push(millis_since(s));
    }
    let (p50, p99) = percentiles(t);
    println!("whole checkpoint 1000 claims rewrite: p50 {p50:.3} ms p99 {p99:.3} ms");
    Ok(())
}

fn main() -> Result<()> {
    let base = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/tmp/storebench".into()),
    );
    match fs::remove_dir_all(&base) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", base.display()))
        }
        _ => {}
    }
    for n in [10, 1000] {
        files(&base, n)?;
        redb(&base, n)?;
    }
    whole(&base)
}
