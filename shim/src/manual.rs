//! The man page `gpushare-runtime.8`, written by `gpushare-runtime --generate-man DIR` for
//! packaging (the other binaries generate theirs from their clap definitions; this one has no
//! command line of its own to generate from, so the page is built here with `roff`, from the
//! same constants the wrapper uses).

use std::path::Path;

use roff::{bold, italic, roman, Roff};

use crate::{config, exec, requests};

/// The page's text (roff).
pub fn page() -> String {
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "GPUSHARE-RUNTIME",
            "8",
            "",
            &format!("gpushare-runtime {}", env!("CARGO_PKG_VERSION")),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman(
        "gpushare-runtime - an OCI runtime wrapper that applies CDI devices, then execs runc",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold("gpushare-runtime"),
        roman(" ["),
        italic("runc global flags"),
        roman("] "),
        italic("command"),
        roman(" ["),
        italic("arguments"),
        roman("]"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "Takes runc's place for container engines without CDI (containerd before 1.7, or 1.7 with CDI off). \
         It is called with exactly runc's command line. For create, run and restore of a container whose \
         OCI config requests CDI devices (annotations ",
    ), bold(requests::ANNOTATION_PREFIX), roman("*, or "), bold(requests::ENV_VAR), roman(
        "=gpushare.io/claim=<uid>,... in its environment), it resolves the devices from the CDI spec \
         directories, applies their edits to the bundle's config.json as the reference CDI library does, \
         records them in the annotation io.gpushare.runtime.injected, and execs the low-level runtime with \
         the same arguments. Every other call goes straight to the low-level runtime.",
    )]);
    r.control("PP", []);
    r.text([roman(
        "A container that requests no device starts even when the specs or the config file are broken. \
         A missing device, or a configured low-level runtime that is missing, fails the start with one \
         line naming it, in runc's log format in the --log file and on stderr.",
    )]);
    r.control("PP", []);
    r.text([
        bold("--version"),
        roman(" (or "),
        bold("-v"),
        roman(") prints this wrapper's version, then the low-level runtime's."),
    ]);
    r.control("SH", ["FILES"]);
    r.control("TP", []);
    r.text([bold(config::DEFAULT_CONFIG_PATH)]);
    r.text([roman(
        "The configuration (TOML; every key optional, unknown keys refused): runtimes (low-level \
         runtime candidates, the first executable wins; default runc, crun), spec_dirs (CDI spec \
         directories, lowest priority first; default /etc/cdi, /var/run/cdi), log_file, log_level.",
    )]);
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []);
    r.text([bold(config::CONFIG_ENV)]);
    r.text([roman(
        "Another configuration file. containerd's shim passes on containerd's environment, not the client's.",
    )]);
    r.control("TP", []);
    r.text([bold(requests::ENV_VAR)]);
    r.text([roman(
        "In a container's OCI environment: the CDI devices it requests, comma-separated (a bare name means kind gpushare.io/claim).",
    )]);
    r.control("TP", []);
    r.text([bold(exec::LOOP_MARKER)]);
    r.text([roman(
        "Set by the wrapper for the runtime it execs; a runtime chain that leads back to the wrapper is stopped with an error.",
    )]);
    r.control("SH", ["EXIT STATUS"]);
    r.text([roman(
        "The low-level runtime's, once exec'd; 1 when the wrapper itself fails.",
    )]);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman(
        "gpushared(8), gpushare(1), gpushare-cdi-hook(8), runc(8)",
    )]);
    r.render()
}

/// Writes `gpushare-runtime.8` into `dir`.
///
/// # Errors
/// Writing failed.
pub fn write(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("gpushare-runtime.8"), page())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_names_the_files_and_variables_the_wrapper_uses() {
        let page = super::page();
        assert!(page.contains("\n.TH GPUSHARE-RUNTIME 8"), "{page}");
        for needle in [
            "/etc/gpushare/runtime.toml",
            "GPUSHARE_RUNTIME_CONFIG",
            "GPUSHARE_VISIBLE_DEVICES",
            "GPUSHARE_RUNTIME_ACTIVE",
            ".SH SYNOPSIS",
            ".SH \"EXIT STATUS\"",
        ] {
            assert!(page.contains(needle), "{needle}");
        }
    }
}
