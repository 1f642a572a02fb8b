//! The names of the quarantine's own files (`<state-dir>/quarantine`), so that its prune
//! counts and removes only what it wrote: `<source>-<unix seconds>-<pid>-<n>.json`. Anything
//! else in the directory (an administrator's notes, a copy kept by hand) is left alone.

/// Every `source` the quarantine files evidence under: a checkpoint entry, a host record, a
/// record refused for colliding with another claim.
pub(super) const SOURCES: [&str; 3] = ["checkpoint-claim", "host-record", "conflicting-claim"];

/// Whether `name` is one the quarantine writes (`checkpoint-claim-1700000000-4242-7.json`).
pub(super) fn is_ours(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".json") else {
        return false;
    };
    SOURCES.iter().any(|source| {
        stem.strip_prefix(source)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|numbers| {
                let parts: Vec<&str> = numbers.split('-').collect();
                parts.len() == 3
                    && parts
                        .iter()
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_quarantines_names_are_ours() {
        for ours in [
            "checkpoint-claim-1700000000-4242-0.json",
            "host-record-1-2-3.json",
            "conflicting-claim-1700000000-1-99.json",
        ] {
            assert!(is_ours(ours), "{ours}");
        }
        for other in [
            "admin-note-1.txt",
            "host-record-notes.json",
            "checkpoint-claim-1-2-3.json.bak",
            "checkpoint-claim-1-2.json",
            "checkpoint-claim-1-2-3-4.json",
            "host-record--2-3.json",
            "other-1-2-3.json",
            ".host-record-1-2-3.json.tmp-5-0",
        ] {
            assert!(!is_ours(other), "{other}");
        }
    }
}
