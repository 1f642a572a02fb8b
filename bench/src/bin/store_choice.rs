//! The measurement behind the store choice (`docs/crash-safety.md`, "Why per-claim files"):
//! per change and at start, one file per claim record (temporary file, fsync, rename, directory
//! fsync) against one redb commit, at 10 and 1,000 records of 1.3 KiB, and the whole-node
//! rewrite the previous checkpoint did. `cargo run --release -p gpushare-bench --bin
//! store-choice [DIR]` (DIR on the disk to measure; default /tmp/storebench).

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;
const T: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");
fn rec(i: usize) -> Vec<u8> {
    let mut v = format!("{{\"uid\":\"{i:08}-0000-4000-8000-000000000000\",\"x\":\"").into_bytes();
    v.extend(std::iter::repeat(b'a').take(1300));
    v.extend(b"\"}");
    v
}
fn write_file(dir: &std::path::Path, name: &str, b: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .unwrap();
    f.write_all(b).unwrap();
    f.sync_all().unwrap();
    fs::rename(&tmp, dir.join(name)).unwrap();
    fs::File::open(dir).unwrap().sync_all().unwrap();
}
fn pct(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[v.len() * 99 / 100])
}
fn main() {
    let base =
        std::path::PathBuf::from(std::env::args().nth(1).unwrap_or("/tmp/storebench".into()));
    let _ = fs::remove_dir_all(&base);
    for n in [10usize, 1000] {
        // files
        let dir = base.join(format!("files-{n}"));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..n {
            write_file(&dir, &format!("{i}.json"), &rec(i));
        }
        let mut t = vec![];
        for k in 0..200 {
            let s = Instant::now();
            write_file(&dir, &format!("{}.json", k % n), &rec(k));
            t.push(s.elapsed().as_secs_f64() * 1e3);
        }
        let (p50, p99) = pct(t);
        let s = Instant::now();
        let mut tot = 0;
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            tot += fs::read(e.path()).unwrap().len();
        }
        println!(
            "files n={n}: change p50 {p50:.3} ms p99 {p99:.3} ms; load all {:.3} ms ({tot} B)",
            s.elapsed().as_secs_f64() * 1e3
        );
        // redb
        let path = base.join(format!("redb-{n}.redb"));
        let db = Database::create(&path).unwrap();
        {
            let w = db.begin_write().unwrap();
            {
                let mut tb = w.open_table(T).unwrap();
                for i in 0..n {
                    tb.insert(format!("{i}").as_str(), rec(i).as_slice())
                        .unwrap();
                }
            }
            w.commit().unwrap();
        }
        let mut t = vec![];
        for k in 0..200 {
            let s = Instant::now();
            let w = db.begin_write().unwrap();
            {
                let mut tb = w.open_table(T).unwrap();
                tb.insert(format!("{}", k % n).as_str(), rec(k).as_slice())
                    .unwrap();
            }
            w.commit().unwrap();
            t.push(s.elapsed().as_secs_f64() * 1e3);
        }
        let (p50, p99) = pct(t);
        drop(db);
        let s = Instant::now();
        let db = Database::create(&path).unwrap();
        let r = db.begin_read().unwrap();
        let tb = r.open_table(T).unwrap();
        let mut tot = 0;
        for e in tb.iter().unwrap() {
            let (_, v) = e.unwrap();
            tot += v.value().len();
        }
        println!("redb  n={n}: change p50 {p50:.3} ms p99 {p99:.3} ms; open+load all {:.3} ms ({tot} B), file {} KiB", s.elapsed().as_secs_f64()*1e3, fs::metadata(&path).unwrap().len()/1024);
    }
    // whole-file rewrite as today, for reference
    let dir = base.join("whole");
    fs::create_dir_all(&dir).unwrap();
    let big: Vec<u8> = (0..1000).flat_map(rec).collect();
    let mut t = vec![];
    for _ in 0..50 {
        let s = Instant::now();
        write_file(&dir, "checkpoint.json", &big);
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p99) = pct(t);
    println!("whole checkpoint 1000 claims rewrite: p50 {p50:.3} ms p99 {p99:.3} ms");
}
